/* tools/supervisor.c — troupe-supervisor: launches a topology and keeps it alive.
 *
 * Duties, in order of the main loop:
 *   - start every instance (fork/exec locally, or the ssh / srun command its node names), in the
 *     topology's order, and wait for each one's READY on the control socket;
 *   - heartbeat every ready actor; one that stops answering for `liveness` heartbeats is wedged
 *     (alive but stuck, e.g. SIGSTOP) and is killed with SIGKILL;
 *   - reap exits and restart by policy (permanent / transient / temporary; one_for_one or
 *     rest_for_one), at most max_restarts in period_s — one more and the whole cluster is stopped
 *     with a report and a non-zero exit;
 *   - on SIGINT / SIGTERM: TERM every actor in reverse start order, wait the grace period, SIGKILL
 *     whatever is left, print the report; exit 0 when every actor exited 0 in time;
 *   - on the way out, every local actor reaped: remove the cluster's files from the run directory
 *     (s_clean_run_dir).
 *
 * Exit codes: 0 clean stop; 1 a stop where some actor had to be killed or failed; 2 bad usage or
 * topology (also when an actor exits ACTOR_EXIT_CONFIG: the topology asks it for what it cannot
 * run, say a model path without weights or a port another program holds; not restarted); 3 gave
 * up after too many restarts; 4 the cluster never became ready.
 *
 * Known limits: a remote (ssh) child is stopped by TERM over the control socket and by killing
 * the local ssh process; if both fail, the remote actor exits by itself once it hears nothing
 * from the supervisor (its orphan timeout). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/runtime/actor.h"
#include "actors/runtime/auth.h"
#include "common/log.h"
#include "common/util.h"
#include "messages/msg.h"
#include "tools/lib/launch.h"
#include "tools/lib/restart.h"
#include "topology/topology.h"

#define EXIT_PARTIAL   1
#define EXIT_USAGE     2
#define EXIT_GAVE_UP   3
#define EXIT_NOT_READY 4

typedef struct child {
    const topo_instance_t *inst;   /* its entry in the topology */
    pid_t pid;                     /* 0 when not running */
    int ready;                     /* READY received from this incarnation */
    uint32_t restarts;             /* incarnations after the first */
    int64_t started_ms;            /* when this incarnation was launched */
    int64_t last_hb_ms;            /* last heartbeat answer (or READY) */
    int unanswered;                /* heartbeats sent since the last answer: > liveness = wedged.
                                      Counted, not timed, so a supervisor that was itself busy
                                      (stopping children for rest_for_one) never blames its actors */
    uint64_t last_steps;           /* progress counter from its last heartbeat */
    int last_status;               /* wait status of the last exit; -1 none yet */
    int finished;                  /* exited and not to be restarted (temporary / transient ok) */
    int stopping;                  /* we asked it to stop; its exit is expected */
} child_t;

typedef struct supervisor {
    topo_t *topo;
    char topo_path[PATH_MAX];      /* absolute, passed to every actor; "" = embedded default */
    char bin_dir[PATH_MAX];
    void *ctx;
    void *control;                 /* ROUTER at endpoints.control_bind */
    void *stats_pub;               /* PUB to the monitor: our own stats */
    auth_t *auth;                  /* ZAP handler when the topology has CURVE keys, else NULL */
    auth_keypair_t kp;             /* our keypair (CURVE) */
    uint64_t forged;               /* control messages refused: the key was not the sender's */
    child_t *children;             /* [n], start order */
    int n;
    restart_window_t window;
    uint64_t hb_seq;
    int64_t started_ms;
    cpu_meter_t cpu;               /* our CPU time at the last stats report */
    uint8_t buf[MSG_MAX_FRAME > 65536 ? 65536 : MSG_MAX_FRAME];
    uint8_t *sendbuf;
    uint64_t total_restarts;
    int lock_fd;                   /* run_dir/supervisor.pid, flock'ed for our lifetime (s_lock_run_dir) */
    int locked;                    /* 1 once lock_fd is flock'ed: the run directory is ours to clean */
    int made_run_dir;              /* we created run_dir: removed on the way out when nothing else is in it */
} supervisor_t;

static volatile sig_atomic_t s_stop_signal = 0;
static void s_on_signal(int sig) { s_stop_signal = sig; }

/* ---- keys ------------------------------------------------------------------------------- */

/* Our own keypair, before the control socket binds: the one in a named security.curve_keys_dir
 * when there is one, else a new one (in memory: files are written only once the bind has shown
 * that no other supervisor of this cluster runs, whose actors use the files). */
static int s_own_key(supervisor_t *s)
{
    char pub[TOPO_PATH_MAX + 128], key[TOPO_PATH_MAX + 128], err[512];
    if (!auth_curve_available()) {
        LOG_E("security: the topology has CURVE keys but this libzmq has no CURVE");
        return -1;
    }
    actor_key_paths(s->topo, "supervisor", pub, key, sizeof pub);
    if (s->topo->security.curve_keys_dir[0] && access(key, R_OK) == 0 && access(pub, R_OK) == 0) {
        if (auth_key_read(pub, s->kp.pub, err, sizeof err) != 0 || auth_key_read(key, s->kp.sec, err, sizeof err) != 0) {
            LOG_E("security: %s", err);
            return -1;
        }
    } else if (zmq_curve_keypair(s->kp.pub, s->kp.sec) != 0) {
        LOG_E("security: zmq_curve_keypair: %s", zmq_strerror(errno));
        return -1;
    }
    char zerr[256];
    if (!(s->auth = auth_new(s->ctx, zerr, sizeof zerr))) {   /* before any handshake can happen */
        LOG_E("security: %s", zerr);
        return -1;
    }
    return 0;
}

/* CURVE keypairs for every instance and for us: made fresh at each launch in the default
 * <run_dir>/keys (0700 directory, 0600 files); in a security.curve_keys_dir the topology names,
 * existing pairs are kept (other nodes read the same files) and only missing ones are made. Then
 * our ZAP handler admits exactly those keys to the control socket. */
static int s_keys(supervisor_t *s)
{
    const topo_t *t = s->topo;
    char pub[TOPO_PATH_MAX + 128], key[TOPO_PATH_MAX + 128], err[512], z85[AUTH_Z85_LEN + 1];
    const int fresh = !t->security.curve_keys_dir[0];
    if (actor_key_paths(t, "supervisor", pub, key, sizeof pub) != 0) {
        LOG_E("security.curve_keys_dir: path too long");
        return -1;
    }
    char *slash = strrchr(pub, '/');
    *slash = 0;
    if (mkdir(pub, 0700) != 0 && errno != EEXIST) {
        LOG_E("security: cannot create the key directory %s: %s", pub, strerror(errno));
        return -1;
    }
    *slash = '/';
    for (int i = 0; i <= t->n_instances; i++) {
        const char *name = i < t->n_instances ? t->instances[i].name : "supervisor";
        const int ours = i == t->n_instances;
        actor_key_paths(t, name, pub, key, sizeof pub);
        if ((fresh || access(key, R_OK) != 0 || access(pub, R_OK) != 0) &&
            (ours ? auth_keypair_write(pub, key, &s->kp, err, sizeof err)
                  : auth_keypair_generate(pub, key, NULL, err, sizeof err)) != 0) {
            LOG_E("security: %s", err);
            return -1;
        }
        if (auth_key_read(pub, z85, err, sizeof err) != 0 || auth_allow(s->auth, "cluster", z85, name) != 0) {
            LOG_E("security: %s", err);
            return -1;
        }
    }
    if (auth_start(s->auth, err, sizeof err) != 0) {
        LOG_E("security: %s", err);
        return -1;
    }
    LOG_I("CURVE: keypairs for %d actors in %.*s", t->n_instances, (int)(strrchr(pub, '/') - pub), pub);
    return 0;
}

/* ---- launching --------------------------------------------------------------------------- */

static int s_spawn(supervisor_t *s, child_t *c)
{
    char **argv = NULL;
    char err[512];
    if (launch_build_argv(s->topo, c->inst, s->bin_dir, s->topo_path[0] ? s->topo_path : NULL,
                          &argv, err, sizeof err) != 0) {
        LOG_E("%s: %s", c->inst->name, err);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        LOG_E("fork for %s: %s", c->inst->name, strerror(errno));
        launch_free_argv(&argv);
        return -1;
    }
    if (pid == 0) {
        char restarts[32];
        snprintf(restarts, sizeof restarts, "%u", c->restarts);
        setenv("TROUPE_SUPERVISED", "1", 1);
        setenv("TROUPE_RESTARTS", restarts, 1);
        /* A local child dies with us even if we are SIGKILLed (no orphaned clusters). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGINT, SIG_IGN);   /* Ctrl-C reaches the whole process group: let us drain them */
        signal(SIGTERM, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "troupe-supervisor: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    launch_free_argv(&argv);
    c->pid = pid;
    c->ready = 0;
    c->stopping = 0;
    c->started_ms = now_ms();
    c->last_hb_ms = c->started_ms;
    LOG_D("started %s pid %d", c->inst->name, (int)pid);
    return 0;
}

static child_t *s_child_by_name(supervisor_t *s, const uint8_t *id, size_t len)
{
    for (int i = 0; i < s->n; i++)
        if (strlen(s->children[i].inst->name) == len && memcmp(s->children[i].inst->name, id, len) == 0)
            return &s->children[i];
    return NULL;
}

static child_t *s_child_by_pid(supervisor_t *s, pid_t pid)
{
    for (int i = 0; i < s->n; i++)
        if (s->children[i].pid == pid)
            return &s->children[i];
    return NULL;
}

static void s_send(supervisor_t *s, child_t *c, const msg_t *m)
{
    size_t len;
    char err[256];
    if (msg_encode(m, s->sendbuf, MSG_MAX_FRAME, &len, err, sizeof err) != 0)
        return;
    const char *name = c->inst->name;
    if (zmq_send(s->control, name, strlen(name), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
        zmq_send(s->control, s->sendbuf, len, ZMQ_DONTWAIT);
}

/* ---- control socket ---------------------------------------------------------------------- */

static void s_read_control(supervisor_t *s)
{
    for (;;) {
        uint8_t id[256];
        int idn = zmq_recv(s->control, id, sizeof id, ZMQ_DONTWAIT);
        if (idn < 0)
            return;
        int more = 0;
        size_t more_len = sizeof more;
        zmq_getsockopt(s->control, ZMQ_RCVMORE, &more, &more_len);
        if (!more)
            continue;
        zmq_msg_t part;
        zmq_msg_init(&part);
        int n = zmq_msg_recv(&part, s->control, ZMQ_DONTWAIT);
        if (n < 0) {
            zmq_msg_close(&part);
            return;
        }
        if (n <= (int)sizeof s->buf)
            memcpy(s->buf, zmq_msg_data(&part), (size_t)n);
        /* With CURVE the sender is who its key says, whatever routing id it claims. */
        const char *uid = s->auth ? zmq_msg_gets(&part, "User-Id") : NULL;
        int forged = s->auth && (!uid || strlen(uid) != (size_t)idn || memcmp(uid, id, (size_t)idn) != 0);
        zmq_msg_close(&part);
        if (forged) {
            s->forged++;
            LOG_W("control: a message claiming to be '%.*s' came with the key of '%s': ignored",
                  idn < (int)sizeof id ? idn : (int)sizeof id, (const char *)id, uid ? uid : "(none)");
            continue;
        }
        child_t *c = s_child_by_name(s, id, (size_t)(idn < (int)sizeof id ? idn : (int)sizeof id));
        msg_t m;
        char err[256];
        if (!c || n > (int)sizeof s->buf || msg_decode(s->buf, (size_t)n, &m, err, sizeof err) != 0)
            continue;   /* not one of ours, or garbage: ignore */
        if (m.type == MSG_READY) {
            if (!c->pid || c->stopping) {
                /* a READY racing with a stop: nothing to do */
            } else if (m.u.ready.pid != (uint32_t)c->pid && c->inst->node >= 0 &&
                s->topo->nodes[c->inst->node].launch == TOPO_LAUNCH_LOCAL) {
                LOG_W("%s: READY from pid %u, expected %d (stale incarnation?)", c->inst->name,
                      m.u.ready.pid, (int)c->pid);
            } else if (!c->ready) {
                c->ready = 1;
                c->unanswered = 0;
                c->last_hb_ms = now_ms();
                LOG_I("%s ready in %lld ms (pid %u%s)", c->inst->name,
                      (long long)(now_ms() - c->started_ms), m.u.ready.pid,
                      c->restarts ? ", restarted" : "");
            }
        } else if (m.type == MSG_HEARTBEAT) {
            c->last_hb_ms = now_ms();
            c->unanswered = 0;
            c->last_steps = m.u.heartbeat.steps;
        }
        msg_free(&m);
    }
}

static void s_heartbeat(supervisor_t *s)
{
    msg_t m;
    msg_init(&m, MSG_HEARTBEAT, 0);
    m.u.heartbeat.seq = ++s->hb_seq;
    for (int i = 0; i < s->n; i++)
        if (s->children[i].pid && s->children[i].ready) {
            s->children[i].unanswered++;
            s_send(s, &s->children[i], &m);
        }
}

static void s_publish_stats(supervisor_t *s)
{
    int ready = 0, running = 0;
    for (int i = 0; i < s->n; i++) {
        running += s->children[i].pid != 0;
        ready += s->children[i].pid && s->children[i].ready;
    }
    double cpu = 0, pct = 0;
    cpu_meter_read(&s->cpu, s->started_ms, &cpu, &pct);   /* 0s if getrusage fails */
    msg_metric_t metrics[] = {
        {.name = "cpu_seconds_total", .value = cpu, .kind = MSG_METRIC_COUNTER},
        {.name = "cpu_percent", .value = pct},
        {.name = "actors_total", .value = s->n},
        {.name = "actors_running", .value = running},
        {.name = "actors_ready", .value = ready},
        {.name = "restarts_total", .value = (double)s->total_restarts, .kind = MSG_METRIC_COUNTER},
        {.name = "auth_refused", .value = (double)auth_refused(s->auth), .kind = MSG_METRIC_COUNTER},
        {.name = "messages_refused", .value = (double)s->forged, .kind = MSG_METRIC_COUNTER},
    };
    msg_t m;
    msg_init(&m, MSG_STATS, 0);
    m.u.stats.role = MSG_ROLE_SUPERVISOR;
    m.u.stats.name = "supervisor";
    m.u.stats.pid = (uint32_t)getpid();
    m.u.stats.uptime_ms = (uint64_t)(now_ms() - s->started_ms);
    m.u.stats.state = s_stop_signal ? MSG_STATE_STOPPING : MSG_STATE_READY;
    m.u.stats.restarts = 0;
    m.u.stats.metrics = metrics;
    m.u.stats.n_metrics = ARRAY_LEN(metrics);
    size_t len;
    char err[256];
    if (msg_encode(&m, s->sendbuf, MSG_MAX_FRAME, &len, err, sizeof err) == 0)
        zmq_send(s->stats_pub, s->sendbuf, len, ZMQ_DONTWAIT);
}

/* ---- stopping ---------------------------------------------------------------------------- */

/* Asks the given children to stop (TERM over the control socket and SIGTERM), in reverse start
 * order, waits up to grace_ms for them, then SIGKILLs the rest. Returns how many had to be
 * killed or exited non-zero. */
static int s_stop_children(supervisor_t *s, const int *idx, int n, int64_t grace_ms, const char *why)
{
    msg_t term;
    msg_init(&term, MSG_TERM, 0);
    term.u.term.reason = why;
    term.u.term.grace_ms = (uint32_t)grace_ms;
    for (int k = n - 1; k >= 0; k--) {
        child_t *c = &s->children[idx[k]];
        if (!c->pid)
            continue;
        c->stopping = 1;
        s_send(s, c, &term);
        kill(c->pid, SIGTERM);
    }
    int bad = 0;
    int64_t deadline = now_ms() + grace_ms;
    for (;;) {
        int left = 0;
        for (int k = 0; k < n; k++) {
            child_t *c = &s->children[idx[k]];
            if (!c->pid)
                continue;
            int st;
            pid_t r = waitpid(c->pid, &st, WNOHANG);
            if (r == c->pid) {
                c->last_status = st;
                c->pid = 0;
                c->ready = 0;
                if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
                    char d[96];
                    LOG_W("%s stopped with %s", c->inst->name, restart_describe_status(st, d, sizeof d));
                    bad++;
                }
            } else {
                left++;
            }
        }
        if (!left)
            return bad;
        if (now_ms() >= deadline)
            break;
        s_read_control(s);
        usleep(10000);
    }
    for (int k = 0; k < n; k++) {
        child_t *c = &s->children[idx[k]];
        if (!c->pid)
            continue;
        LOG_W("%s did not stop within %lld ms: SIGKILL", c->inst->name, (long long)grace_ms);
        kill(c->pid, SIGKILL);
        int st;
        waitpid(c->pid, &st, 0);
        c->last_status = st;
        c->pid = 0;
        c->ready = 0;
        bad++;
    }
    return bad;
}

static int s_stop_all(supervisor_t *s, const char *why)
{
    int *idx = malloc((size_t)s->n * sizeof *idx);
    for (int i = 0; i < s->n; i++)
        idx[i] = i;
    int bad = s_stop_children(s, idx, s->n, (int64_t)s->topo->supervision.grace_s * 1000, why);
    free(idx);
    return bad;
}

static void s_report(supervisor_t *s, FILE *f)
{
    fprintf(f, "\ntroupe-supervisor: report for cluster '%s' (up %.1f s, %llu restarts)\n",
            s->topo->name, (double)(now_ms() - s->started_ms) / 1000.0,
            (unsigned long long)s->total_restarts);
    fprintf(f, "  %-20s %-16s %8s  %s\n", "actor", "role", "restarts", "last exit");
    for (int i = 0; i < s->n; i++) {
        child_t *c = &s->children[i];
        char d[96] = "running";
        if (c->last_status >= 0)
            restart_describe_status(c->last_status, d, sizeof d);
        fprintf(f, "  %-20s %-16s %8u  %s\n", c->inst->name, topo_role_name(c->inst->role),
                c->restarts, d);
    }
    fflush(f);
}

/* ---- failures and restarts --------------------------------------------------------------- */

/* Child `i` exited (status) or must be replaced. Returns 0 to go on, -1 to give up, -2 to give up
 * because the topology asks the actor for what it cannot run (ACTOR_EXIT_CONFIG). */
static int s_on_failure(supervisor_t *s, int i, int status)
{
    child_t *c = &s->children[i];
    char d[96];
    restart_describe_status(status, d, sizeof d);
    if (WIFEXITED(status) && WEXITSTATUS(status) == ACTOR_EXIT_CONFIG) {
        LOG_E("%s exited (%s): it cannot run with this topology (its error is above); restarting cannot help — "
              "stopping the cluster", c->inst->name, d);
        return -2;
    }
    if (!restart_wanted(c->inst->restart, status)) {
        LOG_I("%s exited (%s); %s: not restarted", c->inst->name, d, topo_restart_name(c->inst->restart));
        c->finished = 1;
        return 0;
    }
    if (!restart_window_allow(&s->window, now_ms())) {
        LOG_E("%s exited (%s): more than %d restarts in %d s — giving up and stopping the cluster",
              c->inst->name, d, s->topo->supervision.max_restarts, s->topo->supervision.period_s);
        return -1;
    }
    int affected[4096];
    int n = restart_affected(s->topo->supervision.strategy, i, s->n, affected);
    if (n > 1) {
        /* rest_for_one: the ones started after it depend on it; stop them first (they are
         * restarted below, in start order). */
        s_stop_children(s, affected + 1, n - 1, (int64_t)s->topo->supervision.grace_s * 1000,
                        "rest_for_one restart");
    }
    LOG_W("%s exited (%s): restarting%s", c->inst->name, d, n > 1 ? " with the actors after it" : "");
    for (int k = 0; k < n; k++) {
        child_t *r = &s->children[affected[k]];
        r->restarts++;
        s->total_restarts++;
        if (s_spawn(s, r) != 0)
            return -1;
    }
    return 0;
}

static int s_reap(supervisor_t *s)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return 0;
        child_t *c = s_child_by_pid(s, pid);
        if (!c)
            continue;
        c->pid = 0;
        c->ready = 0;
        c->last_status = st;
        if (c->stopping)
            continue;
        const int rc = s_on_failure(s, (int)(c - s->children), st);
        if (rc != 0)
            return rc;
    }
}

/* Wedged: alive but more than `liveness` heartbeats in a row unanswered (and liveness x
 * heartbeat_ms without an answer). Not ready in time: the
 * ready timeout. Both are killed; the reaper then restarts them by policy. */
static void s_check_liveness(supervisor_t *s)
{
    int64_t now = now_ms();
    int64_t hb_limit = (int64_t)s->topo->supervision.heartbeat_ms * s->topo->supervision.liveness;
    for (int i = 0; i < s->n; i++) {
        child_t *c = &s->children[i];
        if (!c->pid || c->stopping)
            continue;
        if (c->ready && c->unanswered > s->topo->supervision.liveness && now - c->last_hb_ms > hb_limit) {
            LOG_W("%s (pid %d) missed %d heartbeats (%lld ms): wedged, killing it", c->inst->name,
                  (int)c->pid, s->topo->supervision.liveness, (long long)(now - c->last_hb_ms));
            kill(c->pid, SIGKILL);
            c->last_hb_ms = now;   /* one kill per incident */
            c->unanswered = 0;
        } else if (!c->ready && now - c->started_ms > (int64_t)s->topo->supervision.ready_timeout_s * 1000) {
            LOG_W("%s (pid %d) not ready after %d s: killing it", c->inst->name, (int)c->pid,
                  s->topo->supervision.ready_timeout_s);
            kill(c->pid, SIGKILL);
            c->started_ms = now;
        }
    }
}

/* ---- main -------------------------------------------------------------------------------- */

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: troupe-supervisor [--topology FILE] [--bin-dir DIR] [--check] [--print] [--verbose]\n"
            "  Launches every actor of a topology, waits for READY, restarts by policy, and stops\n"
            "  the cluster cleanly on SIGINT/SIGTERM.\n"
            "  --topology FILE  the cluster (default: the embedded one-machine CPU topology)\n"
            "  --bin-dir DIR    where the troupe-<role> binaries are (default: beside this program)\n"
            "  --check          validate the topology, print every problem, exit 0/2\n"
            "  --print          print the effective topology (defaults applied, instances expanded)\n"
            "  --ready-file F   write F once every actor is ready (for scripts)\n"
            "  --verbose        debug logging (also passed to actors via TROUPE_VERBOSE)\n");
}

/* What the command line asked for; everything else comes from the topology. */
typedef struct options {
    const char *topo_arg;     /* --topology FILE; NULL = the embedded default */
    const char *bin_dir;      /* --bin-dir DIR; NULL = beside this program */
    const char *ready_file;   /* --ready-file F; NULL = none */
    int check;                /* --check: validate the topology and exit */
    int print;                /* --print: print the effective topology and exit */
} options_t;

#define GO_ON (-1)   /* not an exit code: this step went well, carry on */

/* Fills *o from argv. Returns GO_ON, or the exit code for --help (0) and bad usage. --verbose
 * takes effect at once, and reaches the actors through the environment they inherit. */
static int s_parse_options(int argc, char **argv, options_t *o)
{
    static const struct option opts[] = {
        {"topology", required_argument, 0, 't'}, {"bin-dir", required_argument, 0, 'b'},
        {"check", no_argument, 0, 'c'},          {"print", no_argument, 0, 'p'},
        {"ready-file", required_argument, 0, 'r'}, {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "t:b:cpr:vh", opts, NULL)) != -1) {
        switch (opt) {
        case 't': o->topo_arg = optarg; break;
        case 'b': o->bin_dir = optarg; break;
        case 'c': o->check = 1; break;
        case 'p': o->print = 1; break;
        case 'r': o->ready_file = optarg; break;
        case 'v': log_set_verbose(1); setenv("TROUPE_VERBOSE", "1", 1); break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "troupe-supervisor: unexpected argument '%s'\n", argv[optind]);
        s_usage(stderr);
        return EXIT_USAGE;
    }
    return GO_ON;
}

/* The topology from --topology, or the embedded default. A bad one is reported with every
 * problem found, not just the first, so one edit can fix them all. */
static int s_load_topology(supervisor_t *s, const options_t *o)
{
    topo_errors_t *errs = calloc(1, sizeof *errs);   /* 32 KB of messages: not on the stack */
    int rc = o->topo_arg ? topo_load_file(o->topo_arg, &s->topo, errs) : topo_load_default(&s->topo, errs);
    if (rc != 0) {
        fprintf(stderr, "troupe-supervisor: %s is not a valid topology:\n", o->topo_arg ? o->topo_arg : "the embedded default");
        topo_errors_print(errs, stderr);
    }
    free(errs);
    return rc != 0 ? -1 : 0;
}

/* --check and --print answer from the topology alone: nothing is bound or started. */
static void s_check_or_print(supervisor_t *s, const options_t *o)
{
    if (o->print)
        topo_print(s->topo, stdout);
    if (o->check)
        printf("%s: ok (%d actors on %d node%s)\n", s->topo->source, s->topo->n_instances,
               s->topo->n_nodes, s->topo->n_nodes == 1 ? "" : "s");
    topo_destroy(&s->topo);
}

/* Every actor is given the topology's path, so it is made absolute (an actor need not share our
 * working directory). The actor binaries are beside ours unless --bin-dir says otherwise. */
static int s_resolve_paths(supervisor_t *s, const options_t *o)
{
    if (o->topo_arg && !realpath(o->topo_arg, s->topo_path)) {
        LOG_E("%s: %s", o->topo_arg, strerror(errno));
        return -1;
    }
    if (o->bin_dir) {
        snprintf(s->bin_dir, sizeof s->bin_dir, "%s", o->bin_dir);
        return 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        LOG_E("cannot find my own directory; pass --bin-dir");
        return -1;
    }
    self[n] = 0;
    snprintf(s->bin_dir, sizeof s->bin_dir, "%s", dirname(self));
    return 0;
}

/* The run directory holds the ipc:// sockets; private to this user. */
static int s_make_run_dir(supervisor_t *s)
{
    const char *run_dir = s->topo->endpoints.run_dir;
    if (mkdir(run_dir, 0700) == 0) {
        s->made_run_dir = 1;
        return 0;
    }
    if (errno != EEXIST) {
        LOG_E("cannot create run directory %s: %s", run_dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* One supervisor per run directory. A second one of a running cluster must be refused before it
 * binds: an ipc bind replaces the first one's control socket file without an error, and the
 * second would then take over heartbeats and restarts of actors it never started. So the run
 * directory holds supervisor.pid, locked (flock: released by the kernel however we die, so a
 * kill -9 leaves no stale lock) for our whole life and holding our pid for the message. */
static int s_lock_run_dir(supervisor_t *s)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/supervisor.pid", s->topo->endpoints.run_dir);
    /* A supervisor of this cluster that is stopping unlinks supervisor.pid, still locked, and may
     * remove the directory (s_clean_run_dir): an open that finds no directory, or a lock won on a
     * file no longer at the path, was in its way; try again, on the path as it is now. */
    for (int attempt = 0;; attempt++) {
        if (attempt > 0 && s_make_run_dir(s) != 0)
            return -1;
        s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (s->lock_fd < 0) {
            if (errno == ENOENT && attempt < 3)
                continue;
            LOG_E("cannot open %s: %s", path, strerror(errno));
            return -1;
        }
        if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
            char pid[32] = "";
            const ssize_t n = pread(s->lock_fd, pid, sizeof pid - 1, 0);
            pid[n > 0 ? n : 0] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
            LOG_E("cluster '%s' is already running: supervisor pid %s holds %s (stop it with SIGTERM first, or give "
                  "this topology another name or endpoints.run_dir)", s->topo->name, pid[0] ? pid : "?", path);
            return -1;
        }
        struct stat held, there;
        if (fstat(s->lock_fd, &held) == 0 && stat(path, &there) == 0 && held.st_dev == there.st_dev &&
            held.st_ino == there.st_ino)
            break;
        close(s->lock_fd);
        s->lock_fd = -1;
        if (attempt >= 3) {
            LOG_E("%s keeps being removed as we lock it (another supervisor of cluster '%s' stopping and starting?)",
                  path, s->topo->name);
            return -1;
        }
    }
    s->locked = 1;
    char pid[32];
    const int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(s->lock_fd, 0) != 0 || pwrite(s->lock_fd, pid, (size_t)n, 0) != n)
        LOG_W("cannot write %s: %s (the lock holds regardless)", path, strerror(errno));
    return 0;
}

/* The control socket, where every actor says READY and answers heartbeats. With CURVE our own
 * key must exist before the bind, and the actors' key files are written only after it: a bind
 * that fails means another supervisor of this cluster runs, and its actors use those files. */
static int s_bind_control(supervisor_t *s)
{
    s->sendbuf = malloc(MSG_MAX_FRAME);
    s->ctx = zmq_ctx_new();
    if (s->topo->security.curve_server_public[0] && s_own_key(s) != 0)
        return -1;
    s->control = zmq_socket(s->ctx, ZMQ_ROUTER);
    actor_sock_defaults(s->control, &s->topo->limits);
    int one = 1;
    zmq_setsockopt(s->control, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    if (s->auth)
        auth_server(s->control, &s->kp, "cluster");
    if (actor_bind(s->control, s->topo->endpoints.control_bind, "endpoints.control") != 0)
        return -1;   /* (the same line as an actor's bind failure; a second supervisor of this run
                      * directory was refused by its lock before this) */
    if (s->auth && s_keys(s) != 0)
        return -1;
    return 0;
}

/* Our own stats go to the monitor like every actor's; with CURVE, to the monitor's key. */
static int s_connect_stats(supervisor_t *s)
{
    s->stats_pub = zmq_socket(s->ctx, ZMQ_PUB);
    actor_sock_defaults(s->stats_pub, &s->topo->limits);
    const topo_instance_t *mon = topo_first(s->topo, ROLE_MONITOR);
    char mon_pub[AUTH_Z85_LEN + 1], kerr[512];
    if (s->auth && mon && (actor_public_key(s->topo, mon->name, mon_pub, kerr, sizeof kerr) != 0 ||
                           auth_client(s->stats_pub, &s->kp, mon_pub) != 0)) {
        LOG_E("security: %s", kerr);
        return -1;
    }
    zmq_connect(s->stats_pub, s->topo->endpoints.stats);
    return 0;
}

/* A stop signal only sets a flag: the run loop then stops the actors in order. SIGPIPE is
 * ignored so that a write to a closed pipe fails instead of killing the supervisor. */
static void s_install_signals(void)
{
    struct sigaction sa = {.sa_handler = s_on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Launches every instance in the topology's order; their READYs arrive in the run loop. If one
 * cannot be launched, those already started are stopped: the cluster never became ready. */
static int s_start_all(supervisor_t *s)
{
    s->n = s->topo->n_instances;
    s->children = calloc((size_t)s->n, sizeof *s->children);
    /* every child knows its instance before the first spawn: a failed start stops and reports
     * all of them, the ones never started included */
    for (int i = 0; i < s->n; i++) {
        s->children[i].inst = &s->topo->instances[i];
        s->children[i].last_status = -1;
    }
    restart_window_init(&s->window, s->topo->supervision.max_restarts,
                        (int64_t)s->topo->supervision.period_s * 1000);
    LOG_I("starting cluster '%s': %d actors from %s", s->topo->name, s->n, s->topo->source);
    for (int i = 0; i < s->n; i++) {
        if (s_spawn(s, &s->children[i]) != 0) {
            s_stop_all(s, "start failed");
            return EXIT_NOT_READY;
        }
    }
    return 0;
}

/* Ready: every actor meant to be running has said READY (one that finished by policy counts). */
static int s_all_ready(const supervisor_t *s)
{
    for (int i = 0; i < s->n; i++)
        if (!s->children[i].finished && !(s->children[i].pid && s->children[i].ready))
            return 0;
    return 1;
}

/* Said once, when the cluster first becomes ready; the ready file lets a script wait for it. */
static void s_announce_ready(const supervisor_t *s, const char *ready_file, int64_t now)
{
    LOG_I("cluster '%s' ready: %d actors in %lld ms; clients: %s; inspect: %s",
          s->topo->name, s->n, (long long)(now - s->started_ms),
          s->topo->endpoints.client, s->topo->endpoints.inspect);
    if (ready_file) {
        FILE *f = fopen(ready_file, "w");
        if (f) {
            fprintf(f, "%lld\n", (long long)(now - s->started_ms));
            fclose(f);
        }
    }
}

/* Once no actor runs (each one finished by its restart policy) there is nothing left to supervise. */
static int s_any_alive(const supervisor_t *s)
{
    int alive = 0;
    for (int i = 0; i < s->n; i++)
        alive += s->children[i].pid != 0;
    return alive != 0;
}

/* The main loop (duties in the file header), woken by the control socket or every 20 ms: a stop
 * signal, control messages, exits and restarts, heartbeat and stats timers, wedged or late
 * actors, the first moment every actor is ready. Returns the exit code. */
static int s_run(supervisor_t *s, const char *ready_file)
{
    int all_ready = 0;
    int64_t next_hb = now_ms(), next_stats = now_ms();
    for (;;) {
        if (s_stop_signal) {
            LOG_I("%s: stopping the cluster (grace %d s)", s_stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
                  s->topo->supervision.grace_s);
            return s_stop_all(s, "supervisor stopping") ? EXIT_PARTIAL : 0;
        }
        zmq_pollitem_t item = {.socket = s->control, .events = ZMQ_POLLIN};
        zmq_poll(&item, 1, 20);
        if (s_stop_signal)
            continue;   /* not a reap first: a Ctrl-C reaches the actors too, and one that has exited
                           by now is part of the stop, not a crash to restart */
        s_read_control(s);
        const int reaped = s_reap(s);
        if (reaped != 0) {
            s_stop_all(s, reaped == -2 ? "an actor cannot run with this topology" : "restart limit reached");
            return reaped == -2 ? EXIT_USAGE : EXIT_GAVE_UP;
        }
        int64_t now = now_ms();
        if (now >= next_hb) {
            s_heartbeat(s);
            next_hb = now + s->topo->supervision.heartbeat_ms;
        }
        if (now >= next_stats) {
            s_publish_stats(s);
            next_stats = now + 1000;
        }
        s_check_liveness(s);
        if (!all_ready && s_all_ready(s)) {
            all_ready = 1;
            s_announce_ready(s, ready_file, now);
        }
        if (!s_any_alive(s)) {
            LOG_I("every actor has exited; stopping");
            return 0;
        }
    }
}

/* Removes endpoint's socket file when it is an ipc endpoint inside the run directory. One
 * elsewhere (an ipc endpoints.client of the user's choosing) is not under our lock, and a cluster
 * started since may have bound the same path: left alone (the next bind replaces it anyway). */
static void s_unlink_ipc(const supervisor_t *s, const char *endpoint)
{
    const char *dir = s->topo->endpoints.run_dir;
    const size_t n = strlen(dir);
    if (strncmp(endpoint, "ipc://", 6) != 0 || strncmp(endpoint + 6, dir, n) != 0 || endpoint[6 + n] != '/')
        return;
    if (unlink(endpoint + 6) != 0 && errno != ENOENT)
        LOG_W("cannot remove %s: %s", endpoint + 6, strerror(errno));
}

/* What the cluster left in its run directory, removed once none of our local actors runs (each
 * one reaped, the SIGKILLed ones too, which could not remove their own; libzmq leaves an ipc
 * socket's file behind even on a clean close): every ipc socket the topology puts there
 * (control, stats, each inbox, a client or inspect endpoint placed there), the expert-parallel
 * groups' meeting sockets, the default key directory <run_dir>/keys (made fresh at each launch;
 * a named security.curve_keys_dir is kept, other nodes read it), supervisor.pid and, when we
 * created it and nothing else is left in it, the directory. Only under our lock of supervisor.pid,
 * which says the directory is ours: a second supervisor of it was refused before it bound anything.
 * Anything else in it (a cache.disk_dir placed there, a user's file) stays. */
static void s_clean_run_dir(supervisor_t *s)
{
    if (!s->locked)
        return;
    const topo_t *t = s->topo;
    const char *dir = t->endpoints.run_dir;
    char path[PATH_MAX];
    s_unlink_ipc(s, t->endpoints.control_bind);
    s_unlink_ipc(s, t->endpoints.stats_bind);
    s_unlink_ipc(s, t->endpoints.inspect);
    for (int k = 0; k < t->endpoints.n_clients; k++)
        s_unlink_ipc(s, t->endpoints.clients[k]);
    for (int i = 0; i < t->n_instances; i++) {
        const topo_instance_t *in = &t->instances[i];
        s_unlink_ipc(s, in->inbox_bind);
        /* <run_dir>/<rank 0's name>.ep<rank> (engine/ep_sock.c): a rank unlinks its own once the
         * group has met, so only one killed while meeting leaves it */
        const int ep = in->actor >= 0 && in->actor < t->n_actors ? t->actors[in->actor].ep : 1;
        for (int r = 0; ep > 1 && in->index % ep == 0 && r < ep; r++)
            if (snprintf(path, sizeof path, "%s/%s.ep%d", dir, in->name, r) < (int)sizeof path)
                unlink(path);
    }
    if (!t->security.curve_keys_dir[0]) {
        char pub[TOPO_PATH_MAX + 128], key[TOPO_PATH_MAX + 128];
        for (int i = 0; i <= t->n_instances; i++)
            if (actor_key_paths(t, i < t->n_instances ? t->instances[i].name : "supervisor", pub, key, sizeof pub) == 0) {
                unlink(pub);
                unlink(key);
            }
        snprintf(path, sizeof path, "%s/keys", dir);
        rmdir(path);   /* absent without CURVE; kept if something else is in it */
    }
    snprintf(path, sizeof path, "%s/supervisor.pid", dir);
    unlink(path);      /* still locked: a supervisor starting now retries on a new file (s_lock_run_dir) */
    if (s->made_run_dir)
        rmdir(dir);    /* fails, harmlessly, when anything else is in it */
}

/* Sockets close before zmq_ctx_term, which would otherwise wait for them forever. Every local
 * actor has been reaped by now (s_stop_all), so the run directory can be cleaned. */
static void s_destroy(supervisor_t *s)
{
    zmq_close(s->control);
    zmq_close(s->stats_pub);
    auth_destroy(&s->auth);
    zmq_ctx_term(s->ctx);
    restart_window_free(&s->window);
    free(s->children);
    free(s->sendbuf);
    s_clean_run_dir(s);
    topo_destroy(&s->topo);
    close(s->lock_fd);             /* the last thing: the run directory is free for another supervisor */
}

int main(int argc, char **argv)
{
    options_t o = {0};
    const int parsed = s_parse_options(argc, argv, &o);
    if (parsed != GO_ON)
        return parsed;
    log_init("supervisor", -1);

    supervisor_t sv = {0}, *s = &sv;
    s->started_ms = now_ms();
    if (s_load_topology(s, &o) != 0)
        return EXIT_USAGE;
    if (o.check || o.print) {
        s_check_or_print(s, &o);
        return 0;
    }
    /* A failed setup leaves the cleanup to exit(): no actor has been started yet. What it made in
     * the run directory goes, if the directory is ours (locked). */
    if (s_resolve_paths(s, &o) != 0 || s_make_run_dir(s) != 0 || s_lock_run_dir(s) != 0 ||
        s_bind_control(s) != 0 || s_connect_stats(s) != 0) {
        s_clean_run_dir(s);
        return EXIT_USAGE;
    }
    s_install_signals();

    int exit_code = s_start_all(s);
    if (exit_code == 0)
        exit_code = s_run(s, o.ready_file);
    s_report(s, stderr);
    s_destroy(s);
    return exit_code;
}
