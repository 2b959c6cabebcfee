/* fuzz_discovery.c: every decoder of bytes a peer sends to discovery (LEADER, HEARTBEAT, INFO
 * frames and TXT items) returns cleanly on any input. The first byte picks the decoder. */
#include "common/common.h"
#include "discovery/discovery.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	const uint8_t *p = data + 1;
	size_t n = size - 1;
	switch (data[0] % 4) {
	case 0: {
		static disc_id_t members[ELEC_MAX_MEMBERS];
		uint64_t epoch;
		disc_id_t leader;
		int cnt;
		(void)disc_leader_decode(p, n, &epoch, &leader, members, &cnt);
		break;
	}
	case 1: {
		uint64_t epoch;
		disc_id_t leader;
		int st, nm;
		(void)disc_heartbeat_decode(p, n, &epoch, &leader, &st, &nm);
		break;
	}
	case 2: {
		disc_info_t info;
		memset(&info, 0, sizeof info);
		disc_info_parse(&info, p, n);
		break;
	}
	case 3: {
		/* key up to the first '=', the rest the value (which may hold NULs) */
		const uint8_t *eq = memchr(p, '=', n);
		size_t klen = eq ? (size_t)(eq - p) : n;
		char key[64];
		if (klen >= sizeof key)
			break;
		memcpy(key, p, klen);
		key[klen] = 0;
		disc_sighting_t s;
		memset(&s, 0, sizeof s);
		disc_txt_parse_item(&s, key, eq ? (const char *)eq + 1 : NULL,
				    eq ? n - klen - 1 : 0);
		break;
	}
	}
	return 0;
}
