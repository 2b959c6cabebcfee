/*
 * planner.h: from a membership view and model metadata to one plan (rank order, hostfiles, RDMA
 * device matrix, shards). Pure: no I/O, no clock, no globals, so every node computes the same plan.
 */
#ifndef SHOAL_PLANNER_H
#define SHOAL_PLANNER_H

#endif
