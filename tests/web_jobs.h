/*
 * web_jobs.h: waiting on a scheduler job's state from a test (tests/test_web.c,
 * tests/test_web_history.c). Header-only; the job's mutex guards its state (web/web_int.h).
 */
#ifndef SHOAL_TESTS_WEB_JOBS_H
#define SHOAL_TESTS_WEB_JOBS_H

#include <pthread.h>

#include "web/web_int.h"

static inline int job_state(web_job_t *j)
{
	pthread_mutex_lock(&j->mu);
	int s = j->state;
	pthread_mutex_unlock(&j->mu);
	return s;
}

static inline void job_wait(web_job_t *j)
{
	pthread_mutex_lock(&j->mu);
	while (j->state != JOB_DONE)
		pthread_cond_wait(&j->cv, &j->mu);
	pthread_mutex_unlock(&j->mu);
}

#endif
