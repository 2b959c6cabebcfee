/*
 * transport.h: the token's keys, the authenticated control channel, and the collectives that
 * ranks use to compute together (TCP, or RDMA through libibverbs).
 */
#ifndef SHOAL_TRANSPORT_H
#define SHOAL_TRANSPORT_H

#endif
