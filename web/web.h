/*
 * web.h: the OpenAI-compatible HTTP API, metrics and the live dashboard (libmicrohttpd + jansson),
 * served by the leader on top of infer's engine interface.
 */
#ifndef SHOAL_WEB_H
#define SHOAL_WEB_H

#endif
