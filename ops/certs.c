/* certs.c — the certificates of a secure local instance (`strata up --secure`,
 * docs/security.md): a cluster CA and, signed by it, one certificate per process, made with the
 * OpenSSL C API. Each certificate's subject OU names its role (strata/rpc.h, RPC_ROLE_*), which
 * is what the nodes check; its subjectAltName holds the hosts it serves. Keys are EC P-256
 * (small, fast handshakes, understood by every gRPC client) and written 0600. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "certs.h"
#include "paths.h"

#define CERTS_CA_DAYS 3650
#define CERTS_LEAF_DAYS 825 /* what clients accept for a server certificate at most */

static void certs_ossl_err(char *out, size_t cap) {
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, out, cap);
    else
        snprintf(out, cap, "no OpenSSL error queued");
    ERR_clear_error();
}

static EVP_PKEY *certs_key_new(void) {
    return EVP_EC_gen("P-256");
}

/* One extension from its configuration text ("critical,CA:TRUE", "DNS:localhost,IP:...").
 * issuer may be NULL for a self-signed certificate (x itself). */
static bool certs_ext(X509 *x, X509 *issuer, int nid, const char *value) {
    X509V3_CTX v3;
    X509V3_set_ctx(&v3, issuer ? issuer : x, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
    bool ok = ext && X509_add_ext(x, ext, -1) == 1;
    X509_EXTENSION_free(ext);
    return ok;
}

/* An unsigned certificate for key with subject O=Strata, OU=ou (NULL: none), CN=cn, valid
 * `days`, issued by issuer (NULL: self-issued). NULL on failure. */
static X509 *certs_x509_new(EVP_PKEY *key, const char *cn, const char *ou, int days, X509 *issuer) {
    X509 *x = X509_new();
    unsigned char serial[16];
    BIGNUM *bn = NULL;
    if (!x || RAND_bytes(serial, sizeof serial) != 1)
        goto fail;
    serial[0] &= 0x7f; /* a positive serial */
    bn = BN_bin2bn(serial, sizeof serial, NULL);
    X509_NAME *name = X509_get_subject_name(x);
    if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) || X509_set_version(x, 2) != 1 ||
        !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), (long)days * 86400) ||
        X509_set_pubkey(x, key) != 1 ||
        X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"Strata", -1, -1,
                                   0) != 1 ||
        (ou && X509_NAME_add_entry_by_txt(name, "OU", MBSTRING_ASC, (const unsigned char *)ou, -1,
                                          -1, 0) != 1) ||
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1,
                                   0) != 1 ||
        X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name) != 1)
        goto fail;
    BN_free(bn);
    return x;
fail:
    BN_free(bn);
    X509_free(x);
    return NULL;
}

static bool certs_sign(X509 *x, EVP_PKEY *key) {
    return X509_sign(x, key, EVP_sha256()) > 0;
}

/* Writes a PEM file atomically (temp + rename), mode 0600 for keys, 0644 for certificates. */
static bool certs_write(const char *path, X509 *x, EVP_PKEY *key) {
    char tmp[OPS_CERTS_PATH_MAX + 8];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return false;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, key ? 0600 : 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    bool ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) == 1
                  : PEM_write_X509(f, x) == 1;
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0)
        return true;
    unlink(tmp);
    return false;
}

static bool certs_path(char *out, const char *dir, const char *name, const char *ext) {
    return (size_t)snprintf(out, OPS_CERTS_PATH_MAX, "%s/%s.%s", dir, name, ext) <
           OPS_CERTS_PATH_MAX;
}

static X509 *certs_read_cert(const char *path) {
    FILE *f = fopen(path, "r");
    X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    return x;
}

static EVP_PKEY *certs_read_key(const char *path) {
    FILE *f = fopen(path, "r");
    EVP_PKEY *k = f ? PEM_read_PrivateKey(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    return k;
}

st_code ops_certs_ca(const char *dir, st_err *err) {
    char cert_path[OPS_CERTS_PATH_MAX], key_path[OPS_CERTS_PATH_MAX], why[256];
    if (!certs_path(cert_path, dir, "ca", "pem") || !certs_path(key_path, dir, "ca", "key"))
        return st_err_set(err, ST_INVALID_ARGUMENT, "%s is too long a path", dir);
    if (access(cert_path, F_OK) == 0 && access(key_path, F_OK) == 0)
        return ST_OK; /* kept: every certificate of the instance chains to it */
    EVP_PKEY *key = certs_key_new();
    X509 *x = key ? certs_x509_new(key, "Strata cluster CA", NULL, CERTS_CA_DAYS, NULL) : NULL;
    bool ok = x && certs_ext(x, NULL, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
              certs_ext(x, NULL, NID_key_usage, "critical,keyCertSign,cRLSign") &&
              certs_ext(x, NULL, NID_subject_key_identifier, "hash") && certs_sign(x, key);
    if (!ok)
        certs_ossl_err(why, sizeof why);
    else if (!certs_write(key_path, NULL, key) || !certs_write(cert_path, x, NULL)) {
        snprintf(why, sizeof why, "%s", strerror(errno));
        ok = false;
    }
    X509_free(x);
    EVP_PKEY_free(key);
    if (!ok)
        return st_err_set(err, ST_INTERNAL,
                          "cannot create the cluster CA in %s: %s; check that the directory is "
                          "writable",
                          dir, why);
    return ST_OK;
}

/* The leaf's extensions: what it may be used for and the hosts it is valid for. */
static bool certs_leaf_exts(X509 *x, X509 *ca, const char *role, const char *san) {
    bool client_only = !strcmp(role, RPC_ROLE_ADMIN);
    return certs_ext(x, ca, NID_basic_constraints, "critical,CA:FALSE") &&
           certs_ext(x, ca, NID_key_usage, "critical,digitalSignature") &&
           certs_ext(x, ca, NID_ext_key_usage,
                     client_only ? "clientAuth" : "serverAuth,clientAuth") &&
           certs_ext(x, ca, NID_subject_key_identifier, "hash") &&
           certs_ext(x, ca, NID_authority_key_identifier, "keyid:always") &&
           (!san || !san[0] || certs_ext(x, ca, NID_subject_alt_name, san));
}

st_code ops_certs_leaf(const char *dir, const char *name, const char *role, const char *san,
                       st_err *err) {
    char cert_path[OPS_CERTS_PATH_MAX], key_path[OPS_CERTS_PATH_MAX], why[256] = "";
    char ca_cert[OPS_CERTS_PATH_MAX], ca_key[OPS_CERTS_PATH_MAX];
    if (!certs_path(cert_path, dir, name, "pem") || !certs_path(key_path, dir, name, "key") ||
        !certs_path(ca_cert, dir, "ca", "pem") || !certs_path(ca_key, dir, "ca", "key"))
        return st_err_set(err, ST_INVALID_ARGUMENT, "%s is too long a path", dir);
    if (access(cert_path, F_OK) == 0 && access(key_path, F_OK) == 0)
        return ST_OK;
    X509 *ca = certs_read_cert(ca_cert);
    EVP_PKEY *cakey = ca ? certs_read_key(ca_key) : NULL;
    EVP_PKEY *key = cakey ? certs_key_new() : NULL;
    X509 *x = key ? certs_x509_new(key, name, role, CERTS_LEAF_DAYS, ca) : NULL;
    bool ok = x && certs_leaf_exts(x, ca, role, san) && certs_sign(x, cakey);
    if (!ok)
        certs_ossl_err(why, sizeof why);
    else if (!certs_write(key_path, NULL, key) || !certs_write(cert_path, x, NULL)) {
        snprintf(why, sizeof why, "%s", strerror(errno));
        ok = false;
    }
    X509_free(x);
    EVP_PKEY_free(key);
    EVP_PKEY_free(cakey);
    X509_free(ca);
    if (!ok)
        return st_err_set(err, ST_INTERNAL,
                          "cannot create the certificate %s for %s (%s): %s; check %s (the CA "
                          "and its key must be readable there)",
                          cert_path, name, role, why[0] ? why : "the CA could not be read", dir);
    return ST_OK;
}
