/* actors/draft_scheduler.c — the draft-scheduler actor: draft acceptance statistics and the speculation policy it publishes.
 *
 * Known limits: this is the actor's skeleton on the shared runtime (READY, heartbeats, stats,
 * drain on TERM). Its message handlers arrive with the serving path; until then any request sent
 * to it is answered with a bad_request error naming the message type, never dropped. */
#include "actors/runtime/actor.h"

int main(int argc, char **argv)
{
    actor_t *a = actor_new(argc, argv, ROLE_DRAFT_SCHEDULER);
    if (!a)
        return 2;
    actor_ops_t ops = {0};
    int rc = actor_run(a, &ops, NULL);
    actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}
