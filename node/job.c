/* job.c — work that must not run on the loop thread: a scan over a whole tablet, or writes that
 * wait for their fsync one batch after another. The loop thread serves every call of the node
 * (and the router's keepalive PINGs, which give up on a link silent for 3 s), so such work runs
 * on a thread of its own and comes back to the loop to answer (docs/cluster.md, "Work off the
 * loop"). node_close waits for running jobs before the server goes: they post to it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "node_internal.h"

void (*node_job_test_hook)(void);

static void job_on_loop(void *arg) {
    node_job *j = arg;
    node_ctx *n = j->n;
    j->done(j); /* frees j */
    n->jobs--;
}

static void *job_thread(void *arg) {
    node_job *j = arg;
    if (node_job_test_hook)
        node_job_test_hook();
    j->work(j);
    /* The queue is full only under a burst of a million posts: wait rather than lose the answer
     * (node_close waits for this post). */
    while (rpc_server_post_item(j->n->rpc, &j->post, job_on_loop, j) != ST_OK)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    return NULL;
}

st_code node_job_start(node_job *j, st_err *err) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    j->n->jobs++;
    int r = pthread_create(&th, &attr, job_thread, j);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        j->n->jobs--;
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "could not start a worker thread (%s); retry later", strerror(r));
    }
    return ST_OK;
}

void node_jobs_wait(node_ctx *n) {
    while (n->rpc && n->jobs > 0)
        event_base_loop(n->base, EVLOOP_ONCE);
}
