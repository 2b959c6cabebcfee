/* fuzz_tp_step.c: the lock-step STEP/BATCH/STOP decoder (infer/tp.c) never reads out of bounds,
 * never crashes, and what it accepts is within its documented ranges. */
#include "common/common.h"
#include "infer/tp.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	dist_step_t s;
	char err[160];
	if (dist_step_decode(data, size, &s, err, sizeof err) == 0) {
		if (s.type != DIST_MSG_STEP && s.type != DIST_MSG_STOP && s.type != DIST_MSG_BATCH)
			abort();
		if (s.type == DIST_MSG_BATCH && (s.n < 1 || s.n > DIST_MAX_STEP_TOKENS))
			abort();
		if (s.type == DIST_MSG_STEP && (s.n < 1 || s.n > DIST_MAX_STEP_TOKENS || s.pos < 0))
			abort();
	}
	return 0;
}
