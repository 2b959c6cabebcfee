/* fuzz_frame.c: the frame codec and every fixed message decoder never read out of bounds or
 * crash on any bytes: the input is parsed as a stream of plaintext frames and each payload is
 * handed to the decoder of its type (and to every decoder, for good measure). */
#include "common/common.h"
#include "transport/frame.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;
	while (off < size) {
		uint16_t type;
		const uint8_t *p;
		size_t plen;
		int64_t n = tp_frame_parse(data + off, size - off, &type, &p, &plen);
		if (n <= 0)
			break; /* need more, or a clean error */
		char err[128], nb[8];
		tp_hello_t h;
		tp_join_t j;
		tp_coll_t c;
		(void)tp_hello_decode(&h, p, plen, err, sizeof err);
		(void)tp_join_decode(&j, p, plen);
		if (tp_coll_decode(&c, p, plen) == 0 && c.len) {
			volatile uint8_t last = p[TP_COLL_WIRE + c.len - 1]; /* in bounds by contract */
			(void)last;
		}
		(void)tp_msg_name(type, nb, sizeof nb);
		off += (size_t)n;
	}
	(void)tp_frame_hdr_parse(size >= 4 ? data : (const uint8_t *)"\0\0\0\0", 256);
	return 0;
}
