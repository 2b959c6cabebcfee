/*
 * agent.h: the agent's state machine (discovering -> settled -> planned -> loading -> serving)
 * that ties discovery, planner, transport, infer and web together on every node.
 */
#ifndef SHOAL_AGENT_H
#define SHOAL_AGENT_H

#endif
