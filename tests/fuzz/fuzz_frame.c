/* fuzz_frame.c: the frame codec and every fixed message decoder never read out of bounds or
 * crash on any bytes: the input is parsed as a stream of plaintext frames and each payload is
 * handed to every decoder (HELLO, JOIN, COLL, RDMA queue-pair data). The whole input also goes
 * to the RDMA device matrix parser (a file from outside). */
#include "common/common.h"
#include "transport/frame.h"
#include "transport/rdma.h"

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
		tp_rdma_qp_info_t q;
		(void)tp_rdma_qp_decode(&q, p, plen, err, sizeof err);
		(void)tp_msg_name(type, nb, sizeof nb);
		off += (size_t)n;
	}
	(void)tp_frame_hdr_parse(size >= 4 ? data : (const uint8_t *)"\0\0\0\0", 256);
	tp_rdma_matrix_t *m = NULL;
	char err[200];
	if (tp_rdma_matrix_parse(&m, (const char *)data, size, 0, err, sizeof err) == 0) {
		int n = tp_rdma_matrix_size(m);
		for (int i = 0; i < n; i++)
			for (int j = 0; j < n; j++)
				(void)tp_rdma_matrix_dev(m, i, j, 0);
	}
	tp_rdma_matrix_free(m);
	return 0;
}
