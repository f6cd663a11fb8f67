/* backup_grant.c — read tickets for backup pieces (GrantBackupRead; docs/security.md, Internal
 * links).
 *
 * A node pulls a piece from another node (PullBackupPiece: CopyBackup, restores into another
 * cluster) by calling ListBackupPieces and ReadBackupFile there with its own certificate, which
 * says strata-node. Serving those two methods to any strata-node certificate would let a stolen
 * node key read every backup, although it reads no rows. So a node caller needs more: a ticket
 * for that one piece, which only a router or operator can ask the holding node for
 * (GrantBackupRead) and which the router hands to the node it asks to pull. Routers and operators
 * read pieces without one; without client certificates (plaintext) there are no roles at all.
 *
 * Tickets are 128 random bits, kept in memory (a restart forgets them: the router's retry of the
 * pull asks for a new one), each for one (backup, piece), dropped after NODE_BK_GRANT_IDLE_US
 * without a use; at most NODE_BK_GRANTS_MAX, the least recently used one making room. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "backup.h"

#define GRANT_BYTES 16
#define NODE_BK_GRANTS_MAX 4096
/* A pull reads its files one after the other and each read uses the ticket again, so this
 * bounds the pause between two reads of one pull, not the length of the pull. */
#define NODE_BK_GRANT_IDLE_US (600 * 1000000LL)

struct bk_grant {
    uint8_t ticket[GRANT_BYTES];
    char *backup; /* malloc'd; NULL: a free slot */
    char piece[NODE_BK_NAME_MAX + 1];
    int64_t used_us; /* st_mono_us of the grant or its last use */
};

static void grant_clear(bk_grant *g) {
    free(g->backup);
    memset(g, 0, sizeof *g);
}

void bk_grants_free(node_backups *b) {
    for (size_t i = 0; b->grants && i < NODE_BK_GRANTS_MAX; i++)
        grant_clear(&b->grants[i]);
    free(b->grants);
    b->grants = NULL;
}

/* A free slot, or the least recently used one cleared. NULL only when out of memory. */
static bk_grant *grant_slot(node_backups *b, int64_t now) {
    if (!b->grants && !(b->grants = calloc(NODE_BK_GRANTS_MAX, sizeof *b->grants)))
        return NULL;
    bk_grant *lru = &b->grants[0];
    for (size_t i = 0; i < NODE_BK_GRANTS_MAX; i++) {
        bk_grant *g = &b->grants[i];
        if (g->backup && now - g->used_us > NODE_BK_GRANT_IDLE_US)
            grant_clear(g);
        if (!g->backup)
            return g;
        if (g->used_us < lru->used_us)
            lru = g;
    }
    grant_clear(lru);
    return lru;
}

static void hex_of(const uint8_t *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static bool bytes_of_hex(const char *hex, uint8_t *out, size_t n) {
    if (strlen(hex) != 2 * n)
        return false;
    for (size_t i = 0; i < 2 * n; i++) {
        char c = hex[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return false;
        out[i / 2] = (uint8_t)(i % 2 ? out[i / 2] | v : v << 4);
    }
    return true;
}

/* Compares every byte whatever differs, so the time taken tells nothing of a ticket. */
static bool same_ticket(const uint8_t *a, const uint8_t *b) {
    uint8_t d = 0;
    for (size_t i = 0; i < GRANT_BYTES; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

void node_h_grant_backup_read(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__GrantBackupReadRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__grant_backup_read_request__descriptor, req_bytes);
    if (!req)
        return;
    bk_name b;
    st_err err = {0};
    st_code rc = bk_name_parse(req->backup, &b, &err);
    if (rc == ST_OK)
        rc = bk_piece_check(req->piece, &err);
    if (rc != ST_OK) {
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    int64_t now = st_mono_us();
    bk_grant *g = grant_slot(n->backups, now);
    char *name = strdup(req->backup);
    if (!g || !name) {
        free(name);
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory granting a backup read");
        return;
    }
    if (getrandom(g->ticket, sizeof g->ticket, 0) != (ssize_t)sizeof g->ticket) {
        free(name);
        node_fail(call, ST_UNAVAILABLE, "no random bytes for a backup read ticket; retry");
        return;
    }
    g->backup = name;
    snprintf(g->piece, sizeof g->piece, "%s", req->piece);
    g->used_us = now;
    char hex[2 * GRANT_BYTES + 1];
    hex_of(g->ticket, sizeof g->ticket, hex);
    Strata__Internal__V1__GrantBackupReadResponse resp;
    strata__internal__v1__grant_backup_read_response__init(&resp);
    resp.ticket = hex;
    node_reply(call, &resp.base);
}

st_code bk_grant_check(node_ctx *n, rpc_call *call, const char *what, const char *backup,
                       const char *piece, const char *ticket, st_err *err) {
    if (strcmp(rpc_call_peer_role(call), RPC_ROLE_NODE) != 0)
        return ST_OK;
    node_backups *b = n->backups;
    uint8_t want[GRANT_BYTES];
    int64_t now = st_mono_us();
    if (bytes_of_hex(ticket, want, sizeof want) && b->grants && backup[0] && piece[0])
        for (size_t i = 0; i < NODE_BK_GRANTS_MAX; i++) {
            bk_grant *g = &b->grants[i];
            if (!g->backup || !same_ticket(g->ticket, want))
                continue;
            if (now - g->used_us > NODE_BK_GRANT_IDLE_US) {
                grant_clear(g);
                break;
            }
            if (strcmp(g->backup, backup) != 0 || strcmp(g->piece, piece) != 0)
                break;
            g->used_us = now;
            return ST_OK;
        }
    /* UNAUTHENTICATED, not PERMISSION_DENIED: the credential (the ticket) is missing or no longer
     * valid, which a new ticket mends, so a router retries the pull with a new one. */
    return st_err_set(err, ST_UNAUTHENTICATED,
                      "%s of piece '%s' of backup '%s' from a client whose certificate names "
                      "strata-node needs a read ticket for that piece, which a router grants to "
                      "the node it asks to pull it (GrantBackupRead); this call's ticket is "
                      "missing, unknown, expired or for another piece. A router retrying the "
                      "pull (CopyBackup, RestoreTable) asks for a new one; a node's certificate "
                      "alone reads no backup (docs/security.md, Internal links)",
                      what, piece, backup);
}
