/* topology.c — the instance topology file (docs/formats/topology.md): a line-oriented parser
 * that names the file and line of every mistake, the checks that make a parsed topology safe to
 * act on (ids, addresses, duplicates, limits), and an atomic writer whose output parses back to
 * the same topology. libc only, like the rest of base/. */
#include "strata/topology.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define TOPO_LINE_BYTES_MAX 2048          /* longer lines are rejected, not truncated */
#define TOPO_FILE_BYTES_MAX (1024 * 1024) /* a topology is a few KiB; refuse anything huge */
#define TOPO_SPLIT_BYTES_DEFAULT (256LL << 20)

typedef enum topo_section { SEC_TOP, SEC_CLUSTER, SEC_ROUTER } topo_section;

/* Parser state: where we are in the file, for "name:line:" prefixes. */
typedef struct topo_parse {
    const char *name;
    int line;
    topo_section sec;
    st_topology *t;
    st_err *err;
} topo_parse;

static st_code perr(topo_parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static st_code perr(topo_parse *p, const char *fmt, ...) {
    char what[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return st_err_set(p->err, ST_INVALID_ARGUMENT, "%s:%d: %s", p->name, p->line, what);
}

/* ---- small string helpers ---- */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* Cluster ids and zones: [a-z][-a-z0-9]*, at most ST_TOPO_ID_MAX characters (Bigtable's rule for
 * cluster ids, minus its minimum length so short local names like "east" work). */
static bool id_valid(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > ST_TOPO_ID_MAX || !(s[0] >= 'a' && s[0] <= 'z'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}

/* Project and instance names are what clients send in resource names: letters, digits, and
 * "-_.:" (project ids like "example.com:proj" exist), never '/' which would break the name. */
static bool name_valid(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > ST_TOPO_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.:", s[i]))
            return false;
    return true;
}

/* An address a process can listen on or be dialled at: host:port with a non-zero port. */
static bool addr_valid(const char *addr) {
    char host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    return strlen(addr) <= ST_TOPO_ADDR_MAX && st_addr_split(addr, host, sizeof host, &port) &&
           port != 0;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- line handlers ---- */

static st_code parse_section(topo_parse *p, char *s) {
    size_t n = strlen(s);
    if (s[n - 1] != ']')
        return perr(p, "section header '%s' lacks its closing ']': write [cluster ID] or [router]",
                    s);
    s[n - 1] = '\0';
    char *inner = trim(s + 1);
    if (!strcmp(inner, "router")) {
        p->sec = SEC_ROUTER;
        return ST_OK;
    }
    if (strncmp(inner, "cluster", 7) || (inner[7] != ' ' && inner[7] != '\t'))
        return perr(p, "unknown section '[%s]': sections are [cluster ID] and [router]", inner);
    char *id = trim(inner + 7);
    if (!id_valid(id))
        return perr(p,
                    "bad cluster id '%s': use a lower-case letter then letters, digits or '-', "
                    "at most %d characters",
                    id, ST_TOPO_ID_MAX);
    if (st_topology_cluster(p->t, id))
        return perr(p, "cluster '%s' is defined twice: give each cluster one section", id);
    if (p->t->n_clusters == ST_TOPO_CLUSTERS_MAX)
        return perr(p, "too many clusters: an instance has at most %d", ST_TOPO_CLUSTERS_MAX);
    st_topo_cluster *c = &p->t->clusters[p->t->n_clusters++];
    memset(c, 0, sizeof *c);
    copy_str(c->id, sizeof c->id, id);
    c->num = (uint32_t)p->t->n_clusters;
    p->sec = SEC_CLUSTER;
    return ST_OK;
}

static st_code parse_top_key(topo_parse *p, const char *key, const char *val) {
    st_topology *t = p->t;
    if (!strcmp(key, "project") || !strcmp(key, "instance")) {
        if (!name_valid(val))
            return perr(p, "bad %s '%s': use letters, digits and '-_.:', at most %d characters",
                        key, val, ST_TOPO_ID_MAX);
        char *dst = key[0] == 'p' ? t->project : t->instance;
        copy_str(dst, ST_TOPO_ID_MAX + 1, val);
        return ST_OK;
    }
    if (!strcmp(key, "split_bytes")) {
        char *end;
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end || v <= 0)
            return perr(p, "bad split_bytes '%s': use a positive whole number of bytes", val);
        t->split_bytes = v;
        return ST_OK;
    }
    return perr(p,
                "unknown key '%s' before any section: top-level keys are project, instance "
                "and split_bytes",
                key);
}

static st_code parse_node(topo_parse *p, st_topo_cluster *c, char *val) {
    char *dir = val + strcspn(val, " \t");
    if (*dir) {
        *dir++ = '\0';
        dir = trim(dir);
    }
    if (!addr_valid(val))
        return perr(p, "bad node address '%s': use HOST:PORT (brackets for IPv6, port 1-65535)",
                    val);
    if (strlen(dir) > ST_TOPO_PATH_MAX)
        return perr(p, "data directory is longer than %d characters", ST_TOPO_PATH_MAX);
    if (c->n_nodes == ST_TOPO_NODES_MAX)
        return perr(p, "too many nodes in cluster '%s': at most %d", c->id, ST_TOPO_NODES_MAX);
    st_topo_node *nd = &c->nodes[c->n_nodes++];
    copy_str(nd->addr, sizeof nd->addr, val);
    copy_str(nd->data_dir, sizeof nd->data_dir, dir);
    return ST_OK;
}

static st_code parse_kv(topo_parse *p, char *s) {
    char *eq = strchr(s, '=');
    if (!eq)
        return perr(p, "expected 'key = value' or a [section], got '%s'", s);
    *eq = '\0';
    char *key = trim(s), *val = trim(eq + 1);
    if (!*val)
        return perr(p, "key '%s' has no value", key);
    if (p->sec == SEC_TOP)
        return parse_top_key(p, key, val);
    if (p->sec == SEC_ROUTER) {
        if (strcmp(key, "listen"))
            return perr(p, "unknown key '%s' in [router]: the key is listen", key);
        if (!addr_valid(val))
            return perr(p, "bad router address '%s': use HOST:PORT (port 1-65535)", val);
        if (p->t->n_routers == ST_TOPO_ROUTERS_MAX)
            return perr(p, "too many routers: at most %d", ST_TOPO_ROUTERS_MAX);
        copy_str(p->t->routers[p->t->n_routers++], ST_TOPO_ADDR_MAX + 1, val);
        return ST_OK;
    }
    st_topo_cluster *c = &p->t->clusters[p->t->n_clusters - 1];
    if (!strcmp(key, "node"))
        return parse_node(p, c, val);
    if (!strcmp(key, "zone")) {
        if (!id_valid(val))
            return perr(p, "bad zone '%s': use a lower-case letter then letters, digits or '-'",
                        val);
        copy_str(c->zone, sizeof c->zone, val);
        return ST_OK;
    }
    return perr(p, "unknown key '%s' in [cluster %s]: keys are zone and node", key, c->id);
}

/* ---- whole-topology checks (after the last line) ---- */

/* Every listening address appears once in the instance: two processes cannot share a port. */
static st_code check_unique(const st_topology *t, const char *name, st_err *err) {
    const char *seen[ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX + ST_TOPO_ROUTERS_MAX];
    const char *dirs[ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX];
    size_t n = 0, nd = 0;
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            const st_topo_node *node = &t->clusters[i].nodes[j];
            for (size_t k = 0; k < n; k++)
                if (!strcmp(seen[k], node->addr))
                    return st_err_set(err, ST_INVALID_ARGUMENT,
                                      "%s: address %s is used by two nodes: give each its own port",
                                      name, node->addr);
            for (size_t k = 0; k < nd && node->data_dir[0]; k++)
                if (!strcmp(dirs[k], node->data_dir))
                    return st_err_set(err, ST_INVALID_ARGUMENT,
                                      "%s: data directory %s is used by two nodes: give each its "
                                      "own directory",
                                      name, node->data_dir);
            seen[n++] = node->addr;
            if (node->data_dir[0])
                dirs[nd++] = node->data_dir;
        }
    for (size_t r = 0; r < t->n_routers; r++) {
        for (size_t k = 0; k < n; k++)
            if (!strcmp(seen[k], t->routers[r]))
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "%s: router address %s is already used by a node or router: "
                                  "give it its own port",
                                  name, t->routers[r]);
        seen[n++] = t->routers[r];
    }
    return ST_OK;
}

static st_code check_topology(st_topology *t, const char *name, st_err *err) {
    if (t->n_clusters == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s: no [cluster ID] section: an instance needs at least one cluster",
                          name);
    uint32_t num = 1;
    for (size_t i = 0; i < t->n_clusters; i++) {
        st_topo_cluster *c = &t->clusters[i];
        if (c->n_nodes == 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "%s: cluster '%s' has no node: add 'node = HOST:PORT DATA_DIR'", name,
                              c->id);
        if (!c->zone[0]) /* the zone is optional; a cluster alone in its zone is the default */
            copy_str(c->zone, sizeof c->zone, c->id);
        for (size_t j = 0; j < c->n_nodes; j++)
            c->nodes[j].num = num++;
    }
    return check_unique(t, name, err);
}

static void topology_defaults(st_topology *t) {
    memset(t, 0, sizeof *t);
    copy_str(t->project, sizeof t->project, "p");
    copy_str(t->instance, sizeof t->instance, "i");
    t->split_bytes = TOPO_SPLIT_BYTES_DEFAULT;
}

/* One line (NUL-terminated, without its newline). */
static st_code parse_line(topo_parse *p, char *line) {
    char *s = trim(line);
    if (!*s || *s == '#')
        return ST_OK;
    if (*s == '[')
        return parse_section(p, s);
    return parse_kv(p, s);
}

st_code st_topology_parse(const char *text, size_t len, const char *name, st_topology *out,
                          st_err *err) {
    topo_parse p = {
        .name = name ? name : "topology", .line = 0, .sec = SEC_TOP, .t = out, .err = err};
    topology_defaults(out);
    char line[TOPO_LINE_BYTES_MAX + 1];
    size_t pos = 0;
    while (pos < len) {
        p.line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - (text + pos)) : len - pos;
        if (ll > TOPO_LINE_BYTES_MAX)
            return perr(&p, "line is longer than %d bytes", TOPO_LINE_BYTES_MAX);
        if (memchr(text + pos, '\0', ll))
            return perr(&p, "line holds a NUL byte: is this a text file?");
        memcpy(line, text + pos, ll);
        line[ll] = '\0';
        st_code rc = parse_line(&p, line);
        if (rc != ST_OK)
            return rc;
        pos += ll + (nl ? 1 : 0);
    }
    return check_topology(out, p.name, err);
}

st_code st_topology_load(const char *path, st_topology *out, st_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return st_err_set(err, ST_NOT_FOUND, "topology file %s does not exist", path);
        return st_err_set(err, ST_INVALID_ARGUMENT, "cannot open topology file %s: %s", path,
                          strerror(errno));
    }
    char *buf = malloc(TOPO_FILE_BYTES_MAX + 1);
    if (!buf) {
        fclose(f);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, TOPO_FILE_BYTES_MAX + 1, f);
    bool bad = ferror(f);
    fclose(f);
    st_code rc;
    if (bad)
        rc = st_err_set(err, ST_INVALID_ARGUMENT, "cannot read topology file %s", path);
    else if (n > TOPO_FILE_BYTES_MAX)
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "topology file %s is larger than %d bytes: is it the right file?", path,
                        TOPO_FILE_BYTES_MAX);
    else
        rc = st_topology_parse(buf, n, path, out, err);
    free(buf);
    return rc;
}

/* ---- writer ---- */

static void write_topology(FILE *f, const st_topology *t) {
    fprintf(f, "# Strata instance topology (docs/formats/topology.md).\n");
    fprintf(f, "project = %s\ninstance = %s\nsplit_bytes = %lld\n", t->project, t->instance,
            (long long)t->split_bytes);
    for (size_t i = 0; i < t->n_clusters; i++) {
        const st_topo_cluster *c = &t->clusters[i];
        fprintf(f, "\n[cluster %s]\nzone = %s\n", c->id, c->zone[0] ? c->zone : c->id);
        for (size_t j = 0; j < c->n_nodes; j++)
            fprintf(f, "node = %s%s%s\n", c->nodes[j].addr, c->nodes[j].data_dir[0] ? " " : "",
                    c->nodes[j].data_dir);
    }
    if (t->n_routers)
        fprintf(f, "\n[router]\n");
    for (size_t r = 0; r < t->n_routers; r++)
        fprintf(f, "listen = %s\n", t->routers[r]);
}

/* Directory part of path, for the fsync that makes a rename durable. */
static void sync_parent_dir(const char *path) {
    char dir[ST_TOPO_PATH_MAX + 1];
    copy_str(dir, sizeof dir, path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        copy_str(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: the file itself is already durable */
        close(fd);
    }
}

st_code st_topology_save(const char *path, const st_topology *t, st_err *err) {
    char tmp[ST_TOPO_PATH_MAX + 16];
    if (strlen(path) > ST_TOPO_PATH_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "topology path is longer than %d characters",
                          ST_TOPO_PATH_MAX);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* owner-only */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f)
        close(fd);
    if (!f)
        return st_err_set(err, ST_UNAVAILABLE,
                          "cannot create %s: %s (check the directory exists "
                          "and is writable)",
                          tmp, strerror(errno));
    write_topology(f, t);
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        if (ok)
            saved = errno;
        unlink(tmp);
        return st_err_set(err, ST_UNAVAILABLE,
                          "cannot write topology file %s: %s (is the disk "
                          "full?)",
                          path, strerror(saved));
    }
    sync_parent_dir(path);
    return ST_OK;
}

const st_topo_cluster *st_topology_cluster(const st_topology *t, const char *id) {
    for (size_t i = 0; i < t->n_clusters; i++)
        if (!strcmp(t->clusters[i].id, id))
            return &t->clusters[i];
    return NULL;
}

bool st_topo_node_sock_path(const char *data_dir, char *out, size_t cap) {
    const size_t max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
    if (!data_dir[0])
        return false;
    int n = snprintf(out, cap, "%s/%s", data_dir, ST_TOPO_NODE_SOCK_NAME);
    return n > 0 && (size_t)n < cap && (size_t)n <= max;
}
