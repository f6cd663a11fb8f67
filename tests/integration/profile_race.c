/* profile_race.c — changes of one app profile sent at the same moment (threads released
 * together) through one router, for profile_race_test.sh. Phases:
 *   create: 8 CreateAppProfile of one id: exactly one OK, 7 ALREADY_EXISTS;
 *   etag:   6 UpdateAppProfile carrying the profile's current etag: one OK, 5 ABORTED;
 *   fields: an update of the description and one of the routing (masks naming only that field)
 *           at once, 5 rounds: both changes are in the stored profile;
 *   delete: 3 updates and a DeleteAppProfile at once, 5 rounds: once the delete answered OK the
 *           profile is NOT_FOUND.
 *   across: with a second router, a create of one id and then an update carrying one etag
 *           through both routers at once, 3 rounds: one OK, the other ALREADY_EXISTS / ABORTED
 *           (the store is a compare-and-set on the first cluster's record);
 *   profile_race ADDR [ADDR_B]
 * Prints one line per check and "PASS" or "FAIL"; exit 0 on PASS, 1 on FAIL, 2 on bad usage.
 * The call deadline (30 s) is a hang guard only. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "strata/rpc.h"

#define IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
#define INSTANCE "projects/p/instances/i"
#define TIMEOUT_MS 30000
#define THREADS_MAX 8

typedef Google__Bigtable__Admin__V2__AppProfile pb_profile;
typedef enum { CREATE, UPDATE_DESC, UPDATE_ROUTE, DELETE } call_kind;

typedef struct caller {
    const char *addr;
    call_kind kind;
    char id[32], desc[32], etag[64];
    pthread_barrier_t *go;
    st_code code;
} caller;

static st_code call(const char *addr, const char *method, const ProtobufCMessage *m, st_buf *resp) {
    uint8_t buf[1024];
    if (protobuf_c_message_get_packed_size(m) > sizeof buf)
        return ST_INTERNAL;
    size_t len = protobuf_c_message_pack(m, buf);
    st_err err = {0};
    return rpc_blocking_unary(addr, NULL, method, st_slice_make(buf, len), NULL, 0, TIMEOUT_MS,
                              resp, &err);
}

static void send_change(caller *c) {
    char name[128];
    snprintf(name, sizeof name, INSTANCE "/appProfiles/%s", c->id);
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting single;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&single);
    single.cluster_id = (char *)(c->kind == UPDATE_ROUTE ? "west" : "east");
    pb_profile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    p.name = name;
    p.description = c->desc;
    p.etag = c->etag;
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    p.single_cluster_routing = &single;
    char *paths[1] = {(char *)(c->kind == UPDATE_ROUTE ? "single_cluster_routing" : "description")};
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.n_paths = 1;
    mask.paths = paths;
    st_buf resp;
    st_buf_init(&resp);
    if (c->kind == CREATE) {
        Google__Bigtable__Admin__V2__CreateAppProfileRequest req;
        google__bigtable__admin__v2__create_app_profile_request__init(&req);
        req.parent = (char *)INSTANCE;
        req.app_profile_id = c->id;
        req.app_profile = &p;
        req.ignore_warnings = true;
        c->code = call(c->addr, IA "CreateAppProfile", &req.base, &resp);
    } else if (c->kind == DELETE) {
        Google__Bigtable__Admin__V2__DeleteAppProfileRequest req;
        google__bigtable__admin__v2__delete_app_profile_request__init(&req);
        req.name = name;
        req.ignore_warnings = true;
        c->code = call(c->addr, IA "DeleteAppProfile", &req.base, &resp);
    } else {
        Google__Bigtable__Admin__V2__UpdateAppProfileRequest req;
        google__bigtable__admin__v2__update_app_profile_request__init(&req);
        req.app_profile = &p;
        req.update_mask = &mask;
        req.ignore_warnings = true;
        c->code = call(c->addr, IA "UpdateAppProfile", &req.base, &resp);
    }
    st_buf_free(&resp);
}

static void *caller_main(void *arg) {
    caller *c = arg;
    pthread_barrier_wait(c->go);
    send_change(c);
    return NULL;
}

/* Runs the n callers at once. */
static void run(caller *c, size_t n) {
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)n);
    pthread_t th[THREADS_MAX];
    for (size_t i = 0; i < n; i++) {
        c[i].go = &go;
        pthread_create(&th[i], NULL, caller_main, &c[i]);
    }
    for (size_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
}

static size_t count(const caller *c, size_t n, st_code code) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += c[i].code == code;
    return k;
}

/* GetAppProfile(id): the status; the profile into *out (caller frees) when OK. */
static st_code get(const char *addr, const char *id, pb_profile **out) {
    char name[128];
    snprintf(name, sizeof name, INSTANCE "/appProfiles/%s", id);
    Google__Bigtable__Admin__V2__GetAppProfileRequest req;
    google__bigtable__admin__v2__get_app_profile_request__init(&req);
    req.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call(addr, IA "GetAppProfile", &req.base, &resp);
    *out = rc == ST_OK ? google__bigtable__admin__v2__app_profile__unpack(NULL, resp.len, resp.data)
                       : NULL;
    st_buf_free(&resp);
    return rc == ST_OK && !*out ? ST_INTERNAL : rc;
}

static caller make(const char *addr, call_kind kind, const char *id, const char *desc,
                   const char *etag) {
    caller c = {.addr = addr, .kind = kind};
    snprintf(c.id, sizeof c.id, "%s", id);
    snprintf(c.desc, sizeof c.desc, "%s", desc);
    snprintf(c.etag, sizeof c.etag, "%s", etag);
    return c;
}

static bool phase_create(const char *addr) {
    caller c[8];
    for (int i = 0; i < 8; i++) {
        char d[16];
        snprintf(d, sizeof d, "d%d", i);
        c[i] = make(addr, CREATE, "dup", d, "");
    }
    run(c, 8);
    size_t ok = count(c, 8, ST_OK), exists = count(c, 8, ST_ALREADY_EXISTS);
    printf("create: 8 at once: %zu OK, %zu ALREADY_EXISTS\n", ok, exists);
    return ok == 1 && exists == 7;
}

static bool phase_etag(const char *addr) {
    pb_profile *p;
    if (get(addr, "dup", &p) != ST_OK) {
        printf("etag: GetAppProfile dup failed\n");
        return false;
    }
    caller c[6];
    for (int i = 0; i < 6; i++)
        c[i] = make(addr, UPDATE_DESC, "dup", "etag-checked", p->etag);
    google__bigtable__admin__v2__app_profile__free_unpacked(p, NULL);
    run(c, 6);
    size_t ok = count(c, 6, ST_OK), aborted = count(c, 6, ST_ABORTED);
    printf("etag: 6 updates with one etag: %zu OK, %zu ABORTED\n", ok, aborted);
    return ok == 1 && aborted == 5;
}

static bool phase_fields(const char *addr) {
    bool pass = true;
    for (int round = 1; round <= 5; round++) {
        char d[16];
        snprintf(d, sizeof d, "f%d", round);
        caller c[2] = {make(addr, UPDATE_DESC, "dup", d, ""),
                       make(addr, UPDATE_ROUTE, "dup", "", "")};
        run(c, 2);
        pb_profile *p;
        bool good = c[0].code == ST_OK && c[1].code == ST_OK && get(addr, "dup", &p) == ST_OK;
        if (good) {
            good = strcmp(p->description, d) == 0 && p->single_cluster_routing &&
                   strcmp(p->single_cluster_routing->cluster_id, "west") == 0;
            printf("fields %d: description '%s' (sent %s), cluster %s (sent west)\n", round,
                   p->description, d,
                   p->single_cluster_routing ? p->single_cluster_routing->cluster_id : "-");
            google__bigtable__admin__v2__app_profile__free_unpacked(p, NULL);
        } else {
            printf("fields %d: update %s / %s\n", round, st_code_name(c[0].code),
                   st_code_name(c[1].code));
        }
        pass = pass && good;
        /* back on east, so the next round's routing update changes something */
        caller del = make(addr, DELETE, "dup", "", ""), again = make(addr, CREATE, "dup", "", "");
        send_change(&del);
        send_change(&again);
    }
    return pass;
}

static bool phase_delete(const char *addr) {
    bool pass = true;
    for (int round = 1; round <= 5; round++) {
        caller mk = make(addr, CREATE, "pdel", "new", "");
        send_change(&mk);
        caller c[4];
        for (int i = 0; i < 3; i++)
            c[i] = make(addr, UPDATE_DESC, "pdel", "updated", "");
        c[3] = make(addr, DELETE, "pdel", "", "");
        run(c, 4);
        pb_profile *p = NULL;
        st_code after = get(addr, "pdel", &p);
        if (p)
            google__bigtable__admin__v2__app_profile__free_unpacked(p, NULL);
        printf("delete %d: create %s, delete %s, then GetAppProfile %s\n", round,
               st_code_name(mk.code), st_code_name(c[3].code), st_code_name(after));
        pass = pass && mk.code == ST_OK && c[3].code == ST_OK && after == ST_NOT_FOUND;
    }
    return pass;
}

/* Waits until b shows profile id with a's etag (its metadata reloads every second); into etag. */
static bool same_etag(const char *a, const char *b, const char *id, char *etag, size_t cap) {
    for (int i = 0; i < 600; i++) { /* hang guard: a minute */
        pb_profile *pa = NULL, *pb = NULL;
        bool same =
            get(a, id, &pa) == ST_OK && get(b, id, &pb) == ST_OK && strcmp(pa->etag, pb->etag) == 0;
        if (same)
            snprintf(etag, cap, "%s", pa->etag);
        if (pa)
            google__bigtable__admin__v2__app_profile__free_unpacked(pa, NULL);
        if (pb)
            google__bigtable__admin__v2__app_profile__free_unpacked(pb, NULL);
        if (same)
            return true;
        usleep(100 * 1000);
    }
    printf("across: the routers never agreed on profile %s\n", id);
    return false;
}

static bool phase_across(const char *a, const char *b) {
    bool pass = true;
    for (int round = 1; round <= 3; round++) {
        char id[16], etag[64];
        snprintf(id, sizeof id, "x%d", round);
        caller c[2] = {make(a, CREATE, id, "a", ""), make(b, CREATE, id, "b", "")};
        run(c, 2);
        printf("across %d: create through A %s, B %s\n", round, st_code_name(c[0].code),
               st_code_name(c[1].code));
        pass = pass && count(c, 2, ST_OK) == 1 && count(c, 2, ST_ALREADY_EXISTS) == 1;
        if (!same_etag(a, b, id, etag, sizeof etag))
            return false;
        caller u[2] = {make(a, UPDATE_DESC, id, "ua", etag), make(b, UPDATE_DESC, id, "ub", etag)};
        run(u, 2);
        printf("across %d: update with etag %s through A %s, B %s\n", round, etag,
               st_code_name(u[0].code), st_code_name(u[1].code));
        pass = pass && count(u, 2, ST_OK) == 1 && count(u, 2, ST_ABORTED) == 1;
    }
    return pass;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: profile_race ADDR [ADDR_B]\n");
        return 2;
    }
    bool pass = phase_create(argv[1]);
    pass = phase_etag(argv[1]) && pass;
    pass = phase_fields(argv[1]) && pass;
    pass = phase_delete(argv[1]) && pass;
    if (argc == 3)
        pass = phase_across(argv[1], argv[2]) && pass;
    printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
