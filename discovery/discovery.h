/*
 * discovery.h: finding peers on the local network by mDNS/DNS-SD, and the election that makes the
 * member with the smallest node ID the leader.
 */
#ifndef SHOAL_DISCOVERY_H
#define SHOAL_DISCOVERY_H

#endif
