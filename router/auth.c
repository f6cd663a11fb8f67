/* auth.c — who may call what on this router (docs/security.md). With --auth-file, every call
 * carries a bearer token (`authorization: Bearer TOKEN`) naming a principal of the file; the call
 * runs only when the role the principal holds on the resource — from the file's grants, the
 * instance's IAM policy and the table's IAM policy (iam.c), the highest — reaches the role its
 * method's permission needs (strata/auth.h). The token is checked when the request's headers
 * end (guard: nothing of an anonymous call's body is buffered, and paths the router does not
 * serve are refused and audited there too), the role once the body names the table (gate, before
 * every handler), so a method added later is refused until it has a permission.
 *
 * The file is re-read when it changes (checked every RTR_AUTH_CHECK_MS) or at rtr_auth_reload
 * (SIGHUP); a file that fails to parse keeps the previous principals. Each connection remembers
 * the last authorization header it sent and the principal it named (auth_memo, for the file
 * loaded then), so a client that sends the same header on every call costs one compare of it
 * per call; a new connection or another header looks the token up in a process-wide cache of
 * token hashes (RTR_AUTH_CACHE_N entries, keyed by the token) and hashes it only on a miss. Both
 * are stamped with the load they were filled under: after a reload every token is checked
 * against the new file again, so a rotated or removed token fails on its next call, on open
 * connections too. */
#include "router_internal.h"

#include <event2/event.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/auth.h"

#define RTR_AUTH_CACHE_N 256         /* cached tokens (direct-mapped) */
#define RTR_AUTH_CACHE_TOKEN_MAX 128 /* longer tokens are hashed every time */

typedef struct auth_cache_ent {
    uint64_t key, gen; /* gen 0: empty */
    uint32_t len;
    uint32_t idx; /* in db.principals */
    char tok[RTR_AUTH_CACHE_TOKEN_MAX];
} auth_cache_ent;

/* What a connection's last call showed (rpc_call_conn_memo): its authorization header, byte for
 * byte, named principals[idx] of the file of load gen. Compared with plain memcmp: the bytes are
 * the ones this connection's own client sent, so timing tells it nothing it does not know. */
#define AUTH_MEMO_HDR_MAX (sizeof "Bearer " - 1 + RTR_AUTH_CACHE_TOKEN_MAX)
typedef struct auth_memo {
    uint64_t gen; /* 0: nothing known */
    uint32_t idx, len;
    char hdr[AUTH_MEMO_HDR_MAX];
} auth_memo;

typedef struct auth_stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} auth_stamp;

struct rtr_auth {
    rtr_ctx *r;
    bool on; /* --auth-file given */
    char path[RTR_AUTH_PATH_MAX + 1];
    st_auth_db db;
    uint64_t gen; /* bumped by every load: cache entries of older ones are stale */
    auth_stamp stamp;
    struct event *timer;
    rtr_audit *audit;
    char instance[RTR_TABLE_NAME_MAX + 1]; /* projects/P/instances/I */
    auth_cache_ent cache[RTR_AUTH_CACHE_N];
    rtr_audit_limit unauth; /* lines for failed authentications */
};

/* ---- the file ---- */

static bool stamp_read(const char *path, auth_stamp *s) {
    struct stat st;
    if (stat(path, &st) != 0)
        return false;
    *s = (auth_stamp){st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
    return true;
}

static bool stamp_same(const auth_stamp *a, const auth_stamp *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

static st_code auth_load(rtr_auth *au, st_err *err) {
    auth_stamp s = {0};
    bool have = stamp_read(au->path, &s);
    st_auth_db db;
    st_auth_db_init(&db);
    st_code rc = st_auth_load(au->path, &db, err);
    if (rc != ST_OK)
        return rc;
    st_auth_db_free(&au->db);
    au->db = db;
    au->gen++;
    if (have)
        au->stamp = s;
    st_log(ST_LOG_INFO, "router", "msg=\"auth file loaded\" path=%s principals=%zu grants=%zu",
           au->path, db.n_principals, db.n_grants);
    if (db.n_orphan_grants)
        st_log(ST_LOG_WARN, "router",
               "msg=\"auth file: grant lines name principals the file does not list; they grant "
               "nothing: delete them (strata auth remove does)\" path=%s lines=%zu",
               au->path, db.n_orphan_grants);
    return ST_OK;
}

void rtr_auth_reload(rtr_ctx *r) {
    rtr_auth *au = r->auth;
    if (!au || !au->on)
        return;
    st_err err = {0};
    if (auth_load(au, &err) != ST_OK) {
        /* Remember the stamp anyway: the same broken file is reported once, not every second. */
        stamp_read(au->path, &au->stamp);
        st_log(ST_LOG_ERROR, "router",
               "msg=\"auth file reload failed: the previous principals stay in force; fix the "
               "file\" err=\"%s\"",
               err.msg);
    }
}

static void auth_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_ctx *r = arg;
    auth_stamp s;
    if (stamp_read(r->auth->path, &s) && !stamp_same(&s, &r->auth->stamp))
        rtr_auth_reload(r);
}

/* ---- tokens ---- */

/* The principal of token, or NULL. */
static const st_auth_principal *token_principal(rtr_auth *au, st_slice tok) {
    bool cacheable = tok.len <= RTR_AUTH_CACHE_TOKEN_MAX;
    uint64_t key = st_hash64(tok.data, tok.len, 0x5eed);
    auth_cache_ent *e = &au->cache[key % RTR_AUTH_CACHE_N];
    if (cacheable && e->gen == au->gen && e->key == key && e->len == tok.len &&
        CRYPTO_memcmp(e->tok, tok.data, tok.len) == 0)
        return &au->db.principals[e->idx];
    uint8_t hash[ST_AUTH_HASH_BYTES];
    st_auth_hash(tok, hash);
    const st_auth_principal *p = st_auth_find_hash(&au->db, hash);
    if (p && cacheable) {
        *e = (auth_cache_ent){
            key, au->gen, (uint32_t)tok.len, (uint32_t)(p - au->db.principals), {0}};
        memcpy(e->tok, tok.data, tok.len);
    }
    return p;
}

/* The principal hdr names by the connection's memo, or NULL (then the memo, if any, in *memo
 * for call_principal to fill). */
static const st_auth_principal *memo_principal(rtr_auth *au, rpc_call *call, const char *hdr,
                                               size_t len, auth_memo **memo) {
    *memo = NULL;
    if (len > AUTH_MEMO_HDR_MAX)
        return NULL;
    auth_memo *m = rpc_call_conn_memo(call, sizeof *m);
    if (m && m->gen == au->gen && m->len == len && memcmp(m->hdr, hdr, len) == 0)
        return &au->db.principals[m->idx];
    *memo = m;
    return NULL;
}

static void memo_fill(rtr_auth *au, auth_memo *m, const char *hdr, size_t len,
                      const st_auth_principal *p) {
    m->gen = au->gen;
    m->idx = (uint32_t)(p - au->db.principals);
    m->len = (uint32_t)len;
    memcpy(m->hdr, hdr, len);
}

bool rtr_auth_on(const rtr_ctx *r) {
    return r->auth && r->auth->on;
}

const char *rtr_auth_instance(const rtr_ctx *r) {
    return r->auth->instance;
}

/* ---- roles ---- */

st_role rtr_auth_role(rtr_ctx *r, const char *principal, const char *table) {
    rtr_auth *au = r->auth;
    const char *id = NULL;
    if (table) { /* a table of this instance: "<instance>/tables/<id>" */
        size_t n = strlen(au->instance);
        if (!strncmp(table, au->instance, n) && !strncmp(table + n, "/tables/", 8))
            id = table + n + 8;
    }
    st_role role = st_auth_file_role(&au->db, principal, id);
    const rtr_meta_rec *rec = rtr_meta_find(&r->meta, RTR_META_KIND_IAM, au->instance);
    st_role iam = rec ? rtr_iam_role(st_slice_make(rec->pb, rec->len), principal) : ST_ROLE_NONE;
    role = iam > role ? iam : role;
    if (id && role < ST_ROLE_ADMIN &&
        (rec = rtr_meta_find(&r->meta, RTR_META_KIND_IAM, table)) != NULL) {
        iam = rtr_iam_role(st_slice_make(rec->pb, rec->len), principal);
        role = iam > role ? iam : role;
    }
    return role;
}

/* The table a table-scoped request names (field 1, or field 1 of field 1), into out; false when
 * it names none of this instance (the instance is then the resource). */
static bool request_table(const rtr_auth *au, st_slice req, bool nested, char *out, size_t cap) {
    for (int depth = nested ? 2 : 1; depth > 0; depth--) {
        const uint8_t *p = req.data, *end = rtr_slice_end(req);
        rtr_wire_field f;
        bool bad = false, found = false;
        while (rtr_wire_next(&p, end, &f, &bad))
            if (f.num == 1 && f.wire_type == 2) {
                req = f.bytes;
                found = true;
            }
        if (bad || !found)
            return false;
    }
    size_t n = strlen(au->instance);
    if (req.len >= cap || req.len <= n + 8 || memcmp(req.data, au->instance, n) ||
        memcmp(req.data + n, "/tables/", 8) || memchr(req.data, 0, req.len))
        return false;
    /* The handler checks the name fully; here an id without '/' is enough: it is only compared
     * with grants and IAM records, which hold valid names. */
    if (memchr(req.data + n + 8, '/', req.len - n - 8))
        return false;
    memcpy(out, req.data, req.len);
    out[req.len] = '\0';
    return true;
}

/* ---- the gate ---- */

static void audit(rtr_auth *au, rpc_call *call, const char *principal, const char *resource,
                  const char *perm, const char *outcome, st_code code, const char *message) {
    if (!au->audit)
        return;
    rtr_audit_rec rec = {principal ? principal : "",
                         rpc_call_peer(call),
                         rpc_call_path(call),
                         resource,
                         perm,
                         outcome,
                         code,
                         message};
    rtr_audit_write(au->audit, &rec);
}

/* The audit line of a refused call. Refusals of callers without a principal (no valid token,
 * or a router without --auth-file) are written at most RTR_AUDIT_UNAUTH_PER_SEC a second: they
 * cost an attacker nothing. */
static void audit_refusal(rtr_auth *au, rpc_call *call, const char *principal, const char *resource,
                          const char *perm, st_code code, const char *msg) {
    uint64_t suppressed = 0;
    if (principal && principal[0])
        audit(au, call, principal, resource, perm, "denied", code, msg);
    else if (rtr_audit_limit_take(&au->unauth, st_mono_us(), &suppressed)) {
        char line[RPC_GRPC_MESSAGE_MAX];
        if (suppressed)
            snprintf(line, sizeof line,
                     "%s (and %llu earlier failed authentications not written: at most %d "
                     "lines a second)",
                     msg, (unsigned long long)suppressed, RTR_AUDIT_UNAUTH_PER_SEC);
        audit(au, call, principal, resource, perm, "denied", code, suppressed ? line : msg);
    }
}

static bool refuse(rtr_auth *au, rpc_call *call, const char *principal, const char *resource,
                   const char *perm, st_code code, const char *msg) {
    audit_refusal(au, call, principal, resource, perm, code, msg);
    rtr_fail(call, code, "%s", msg);
    return false;
}

#define MSG_NO_TOKEN                                                                               \
    "this router requires a bearer token: send 'authorization: Bearer TOKEN' (cbt -access-token "  \
    "TOKEN, over TLS)"
#define MSG_BAD_HEADER "the authorization header is not 'Bearer TOKEN'"
#define MSG_BAD_TOKEN                                                                              \
    "the bearer token is not valid (unknown, rotated or removed): ask the instance's "             \
    "administrator for a current one (strata auth)"

/* The principal of call's bearer token; NULL with *why set when it has none that is valid. */
static const st_auth_principal *call_principal(rtr_auth *au, rpc_call *call, const char **why) {
    const char *hdr = rpc_call_header(call, "authorization");
    size_t len = hdr ? strlen(hdr) : 0;
    auth_memo *memo = NULL;
    const st_auth_principal *p = hdr ? memo_principal(au, call, hdr, len, &memo) : NULL;
    if (p) {
        *why = NULL;
        return p;
    }
    st_slice tok;
    if (!st_auth_bearer_parse(hdr, &tok)) {
        *why = hdr ? MSG_BAD_HEADER : MSG_NO_TOKEN;
        return NULL;
    }
    p = token_principal(au, tok);
    *why = p ? NULL : MSG_BAD_TOKEN;
    if (p && memo)
        memo_fill(au, memo, hdr, len, p);
    return p;
}

const char *rtr_auth_principal(rtr_ctx *r, rpc_call *call) {
    rtr_auth *au = r->auth;
    if (!au || !au->on)
        return NULL;
    const char *why;
    const st_auth_principal *p = call_principal(au, call, &why);
    return p ? p->name : NULL;
}

/* Runs when the request's headers end, before its body is read (rpc_guard_fn): a call without
 * a valid token is refused here, for every path (the router's or not, so an anonymous probe
 * learns nothing about which exist) and buffers no body; a path the router does not serve is
 * refused and audited like any other refusal. The role, which needs the table the body names,
 * is checked by gate() once the body arrived. */
static st_code guard(rpc_call *call, const char *path, void *arg, st_err *err) {
    rtr_auth *au = ((rtr_ctx *)arg)->auth;
    const st_auth_method *m = st_auth_method_find(path);
    const char *perm = m ? m->perm : NULL, *who = NULL, *why = NULL;
    if (au->on) {
        const st_auth_principal *p = call_principal(au, call, &why);
        if (!p) {
            audit_refusal(au, call, NULL, au->instance, perm, ST_UNAUTHENTICATED, why);
            return st_err_set(err, ST_UNAUTHENTICATED, "%s", why);
        }
        who = p->name;
    }
    char msg[RPC_GRPC_MESSAGE_MAX];
    if (!rpc_call_method_known(call)) {
        snprintf(msg, sizeof msg,
                 "unknown method %.200s: this router serves the Bigtable data and admin APIs "
                 "(docs/router.md); Strata's internal services are not reachable through it",
                 path);
        audit_refusal(au, call, who, au->instance, NULL, ST_UNIMPLEMENTED, msg);
        return st_err_set(err, ST_UNIMPLEMENTED, "%s", msg);
    }
    if (au->on && !m) {
        snprintf(msg, sizeof msg, "method %.200s is not open to clients", path);
        audit_refusal(au, call, who, au->instance, NULL, ST_PERMISSION_DENIED, msg);
        return st_err_set(err, ST_PERMISSION_DENIED, "%s", msg);
    }
    return ST_OK;
}

static bool gate(rpc_call *call, st_slice req, void *arg) {
    rtr_ctx *r = arg;
    rtr_auth *au = r->auth;
    const st_auth_method *m = st_auth_method_find(rpc_call_path(call));
    if (!au->on && (!m || !m->admin))
        return true; /* an audit log only: it records admin calls */
    char table[RTR_TABLE_NAME_MAX + 1];
    bool has_table = m && m->scope == ST_AUTH_SCOPE_TABLE &&
                     request_table(au, req, m->nested, table, sizeof table);
    const char *resource = has_table ? table : au->instance;
    const char *perm = m ? m->perm : NULL;
    if (!au->on) {
        audit(au, call, NULL, resource, perm, "allowed", ST_OK, NULL);
        return true;
    }
    /* Again: the file may have been reloaded since guard() saw the headers. */
    const char *why;
    const st_auth_principal *p = call_principal(au, call, &why);
    if (!p)
        return refuse(au, call, NULL, resource, perm, ST_UNAUTHENTICATED, why);
    char msg[RPC_GRPC_MESSAGE_MAX];
    if (!m) {
        snprintf(msg, sizeof msg, "method %.200s is not open to clients", rpc_call_path(call));
        return refuse(au, call, p->name, resource, NULL, ST_PERMISSION_DENIED, msg);
    }
    if (m->scope == ST_AUTH_SCOPE_ANY)
        return true;
    const st_auth_perm *need = st_auth_perm_find(m->perm);
    st_role role = rtr_auth_role(r, p->name, has_table ? table : NULL);
    if (!need || role < need->role) {
        snprintf(msg, sizeof msg,
                 "permission %s denied on %.300s to principal %s (role %s there; it needs %s): "
                 "ask an admin for the role (strata auth grant, or SetIamPolicy)",
                 m->perm, resource, p->name, st_auth_role_name(role),
                 need ? st_auth_role_name(need->role) : "an unknown role");
        return refuse(au, call, p->name, resource, m->perm, ST_PERMISSION_DENIED, msg);
    }
    if (m->admin)
        audit(au, call, p->name, resource, m->perm, "allowed", ST_OK, NULL);
    return true;
}

/* ---- open / close ---- */

static st_code auth_start(rtr_ctx *r, rtr_auth *au, st_err *err) {
    const rtr_opts *o = &r->opts;
    if (o->auth_file) {
        if (strlen(o->auth_file) > RTR_AUTH_PATH_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT, "--auth-file path too long");
        snprintf(au->path, sizeof au->path, "%s", o->auth_file);
        au->on = true;
        if (!o->ssl_ctx)
            st_log(ST_LOG_WARN, "router",
                   "msg=\"--auth-file without TLS: tokens cross the network in clear text and can "
                   "be replayed; add --tls-cert and --tls-key\"");
        st_code rc = auth_load(au, err);
        if (rc != ST_OK)
            return rc;
        struct timeval tv = {RTR_AUTH_CHECK_MS / 1000, RTR_AUTH_CHECK_MS % 1000 * 1000};
        au->timer = event_new(r->base, -1, EV_PERSIST, auth_timer_cb, r);
        if (!au->timer || event_add(au->timer, &tv) != 0)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot start the auth file timer");
    }
    if (o->audit_log && !(au->audit = rtr_audit_open(o->audit_log, o->audit_log_bytes_max, err)))
        return err ? err->code : ST_INVALID_ARGUMENT;
    if (au->on || au->audit) {
        rpc_server_set_guard(r->rpc, guard, r);
        rpc_server_set_gate(r->rpc, gate, r);
    }
    return ST_OK;
}

st_code rtr_auth_open(rtr_ctx *r, st_err *err) {
    rtr_auth *au = calloc(1, sizeof *au);
    if (!au)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    au->r = r;
    st_auth_db_init(&au->db);
    snprintf(au->instance, sizeof au->instance, "projects/%s/instances/%s", r->topo.project,
             r->topo.instance);
    r->auth = au;
    st_code rc = auth_start(r, au, err);
    return rc == ST_OK ? rtr_iam_register(r, err) : rc;
}

void rtr_auth_close(rtr_ctx *r) {
    rtr_auth *au = r->auth;
    if (!au)
        return;
    if (au->timer)
        event_free(au->timer);
    rtr_audit_close(au->audit);
    st_auth_db_free(&au->db);
    OPENSSL_cleanse(au->cache, sizeof au->cache);
    free(au);
    r->auth = NULL;
}
