/* TLS for the RPC layer: contexts with ALPN h2, the certificates, peer roles. tlsio.c runs the
 * connections. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "rpc_internal.h"

static const unsigned char alpn_h2[] = {2, 'h', '2'};

static void tls_err_text(char *out, size_t n) {
    unsigned long e = ERR_get_error();
    if (e == 0)
        snprintf(out, n, "no OpenSSL error queued");
    else
        ERR_error_string_n(e, out, n);
    ERR_clear_error();
}

static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl;
    (void)arg;
    /* Only h2: a peer that cannot speak HTTP/2 cannot speak gRPC. */
    for (unsigned int i = 0; i < inlen;) {
        unsigned int l = in[i];
        if (i + 1 + l > inlen)
            break;
        if (l == 2 && memcmp(in + i + 1, "h2", 2) == 0) {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + l;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* TLS 1.3 suites, AES-128-GCM first: the cheapest on CPUs with AES instructions and, for data
 * in flight between a client and its database, as strong a protection as AES-256
 * (docs/security.md, Performance). */
static const char tls13_suites[] =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

st_code rpc_tls_server_ctx_prepare(SSL_CTX *ctx, st_err *err) {
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION))
        return st_err_set(err, ST_INTERNAL, "cannot require TLS 1.2");
    if (!SSL_CTX_set_ciphersuites(ctx, tls13_suites))
        return st_err_set(err, ST_INTERNAL, "cannot set the TLS 1.3 cipher suites");
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION |
                                 SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select_cb, NULL);
    return ST_OK;
}

st_code rpc_tls_client_ctx_prepare(SSL_CTX *ctx, st_err *err) {
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION))
        return st_err_set(err, ST_INTERNAL, "cannot require TLS 1.2");
    if (!SSL_CTX_set_ciphersuites(ctx, tls13_suites))
        return st_err_set(err, ST_INTERNAL, "cannot set the TLS 1.3 cipher suites");
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    if (SSL_CTX_set_alpn_protos(ctx, alpn_h2, sizeof(alpn_h2)) != 0)
        return st_err_set(err, ST_INTERNAL, "cannot set ALPN h2");
    return ST_OK;
}

/* A file the process cannot open is reported as such (with errno), before OpenSSL's less
 * telling "system lib" error. */
static bool tls_file_readable(const char *what, const char *path, st_err *err) {
    FILE *f = fopen(path, "r");
    if (f) {
        fclose(f);
        return true;
    }
    st_err_set(err, ST_INVALID_ARGUMENT,
               "cannot read the TLS %s %s: %s; check the path and its "
               "permissions",
               what, path, strerror(errno));
    return false;
}

/* Certificate chain and key into ctx, each step with its own message. */
static st_code tls_server_load_pair(SSL_CTX *ctx, const char *cert_path, const char *key_path,
                                    st_err *err) {
    char why[256];
    if (!tls_file_readable("certificate", cert_path, err) ||
        !tls_file_readable("key", key_path, err))
        return ST_INVALID_ARGUMENT;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1) {
        tls_err_text(why, sizeof(why));
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s is not a PEM certificate (chain) (%s); give the server "
                          "certificate in PEM form, intermediates after it",
                          cert_path, why);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) != 1) {
        /* OpenSSL checks the key against the certificate while loading it */
        unsigned long e = ERR_peek_last_error();
        bool mismatch =
            ERR_GET_LIB(e) == ERR_LIB_X509 && (ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH ||
                                               ERR_GET_REASON(e) == X509_R_KEY_TYPE_MISMATCH);
        tls_err_text(why, sizeof(why));
        if (mismatch)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "the key %s does not match the certificate %s (%s); give the key "
                              "the certificate was issued for",
                              key_path, cert_path, why);
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s is not an unencrypted PEM private key (%s); give the key in PEM "
                          "form without a passphrase",
                          key_path, why);
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        tls_err_text(why, sizeof(why));
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the key %s does not match the certificate %s (%s); give the key the "
                          "certificate was issued for",
                          key_path, cert_path, why);
    }
    return ST_OK;
}

SSL_CTX *rpc_tls_server_ctx_new(const char *cert_path, const char *key_path,
                                const char *client_ca_path, st_err *err) {
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_err_text(why, sizeof(why));
        st_err_set(err, ST_INTERNAL, "SSL_CTX_new failed: %s", why);
        return NULL;
    }
    if (tls_server_load_pair(ctx, cert_path, key_path, err) != ST_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (client_ca_path) {
        if (!tls_file_readable("client CA", client_ca_path, err)) {
            SSL_CTX_free(ctx);
            return NULL;
        }
        if (SSL_CTX_load_verify_locations(ctx, client_ca_path, NULL) != 1) {
            tls_err_text(why, sizeof(why));
            st_err_set(err, ST_INVALID_ARGUMENT,
                       "cannot load the client CA %s (%s); give the CA certificate(s) in PEM "
                       "form",
                       client_ca_path, why);
            SSL_CTX_free(ctx);
            return NULL;
        }
        /* The CA names go into the CertificateRequest, so clients holding several certificates
         * pick one this server accepts. */
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca_path);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
        ERR_clear_error();
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    if (rpc_tls_server_ctx_prepare(ctx, err) != ST_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static st_code tls_client_load(SSL_CTX *ctx, const char *ca_path, const char *cert_path,
                               const char *key_path, st_err *err);

SSL_CTX *rpc_tls_client_ctx_new(const char *ca_path, const char *cert_path, const char *key_path,
                                st_err *err) {
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        tls_err_text(why, sizeof(why));
        st_err_set(err, ST_INTERNAL, "SSL_CTX_new failed: %s", why);
        return NULL;
    }
    if (!ca_path)
        st_log(ST_LOG_WARN, "rpc", "msg=\"TLS client without a CA: server NOT verified\"");
    if (tls_client_load(ctx, ca_path, cert_path, key_path, err) != ST_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (rpc_tls_client_ctx_prepare(ctx, err) != ST_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* ---- peer roles ---- */

bool rpc_tls_peer_role(const SSL *ssl, char *out, size_t cap) {
    out[0] = '\0';
    X509 *x = ssl ? SSL_get0_peer_certificate(ssl) : NULL;
    if (!x || SSL_get_verify_result(ssl) != X509_V_OK)
        return false;
    X509_NAME *name = X509_get_subject_name(x);
    for (int i = -1; (i = X509_NAME_get_index_by_NID(name, NID_organizationalUnitName, i)) >= 0;) {
        ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
        const unsigned char *v = ASN1_STRING_get0_data(d);
        int len = ASN1_STRING_length(d);
        /* only plain "strata-..." names of a sane length; anything else is not a role */
        if (len < 8 || (size_t)len >= cap || memcmp(v, "strata-", 7) != 0 ||
            memchr(v, '\0', (size_t)len))
            continue;
        memcpy(out, v, (size_t)len);
        out[len] = '\0';
        return true;
    }
    return false;
}

/* The CA, certificate and key of a client context, loaded into ctx (fresh or scratch). */
static st_code tls_client_load(SSL_CTX *ctx, const char *ca_path, const char *cert_path,
                               const char *key_path, st_err *err) {
    char why[256];
    if (ca_path) {
        if (!tls_file_readable("CA", ca_path, err))
            return ST_INVALID_ARGUMENT;
        if (SSL_CTX_load_verify_locations(ctx, ca_path, NULL) != 1) {
            tls_err_text(why, sizeof(why));
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "cannot load the CA %s (%s); give the CA certificate(s) in PEM form",
                              ca_path, why);
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    if (cert_path && key_path) {
        if (!tls_file_readable("certificate", cert_path, err) ||
            !tls_file_readable("key", key_path, err))
            return ST_INVALID_ARGUMENT;
        if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            tls_err_text(why, sizeof(why));
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "cannot use the client certificate %s with the key %s (%s); give a "
                              "PEM certificate and the unencrypted PEM key it was issued for",
                              cert_path, key_path, why);
        }
    }
    return ST_OK;
}

st_code rpc_tls_client_ctx_reload(SSL_CTX *ctx, const char *ca_path, const char *cert_path,
                                  const char *key_path, st_err *err) {
    SSL_CTX *scratch = SSL_CTX_new(TLS_client_method());
    if (!scratch)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reloading TLS files");
    st_code rc = tls_client_load(scratch, ca_path, cert_path, key_path, err);
    SSL_CTX_free(scratch);
    if (rc != ST_OK)
        return rc;
    /* The files load: now into the live context. A CA store is replaced whole (adding to the old
     * one would keep trusting a CA that was removed). */
    if (ca_path) {
        X509_STORE *store = X509_STORE_new();
        if (!store)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reloading the CA");
        SSL_CTX_set_cert_store(ctx, store);
    }
    return tls_client_load(ctx, ca_path, cert_path, key_path, err);
}

/* An ASN1_TIME as "2021-01-01 00:00:00 GMT" (OpenSSL's ISO 8601 form). */
static void tls_time_text(const ASN1_TIME *t, char *out, size_t cap) {
    BIO *b = BIO_new(BIO_s_mem());
    int n = b && ASN1_TIME_print_ex(b, t, ASN1_DTFLGS_ISO8601) == 1 ? BIO_read(b, out, (int)cap - 1)
                                                                    : -1;
    out[n > 0 ? n : 0] = '\0';
    if (n <= 0)
        snprintf(out, cap, "(unreadable)");
    BIO_free(b);
}

/* What to do about a certificate out of its validity: a new one from the same CA; for one that
 * `strata up --secure` made (DIR/secure/NAME.pem), the commands that make it again. */
static void tls_renew_text(const char *cert_path, char *out, size_t cap) {
    static const char sub[] = "/secure/";
    const char *slash = strrchr(cert_path, '/');
    size_t sub_len = sizeof sub - 1;
    size_t dir_len = slash ? (size_t)(slash - cert_path) + 1 : 0; /* with the slash */
    if (dir_len > sub_len && !memcmp(cert_path + dir_len - sub_len, sub, sub_len)) {
        int inst = (int)(dir_len - sub_len);
        snprintf(out, cap,
                 "; `strata up --secure` made it: delete it and its .key, then `strata down "
                 "--dir %.*s` and `strata up --dir %.*s --secure` make new ones from the same CA",
                 inst, cert_path, inst, cert_path);
    } else {
        snprintf(out, cap,
                 "; issue a new one from the same CA and start again with it "
                 "(docs/security.md, Certificates)");
    }
}

st_code rpc_tls_cert_current(const char *cert_path, st_err *err) {
    if (!tls_file_readable("certificate", cert_path, err))
        return err ? err->code : ST_INVALID_ARGUMENT;
    FILE *f = fopen(cert_path, "r");
    X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    if (!x) {
        ERR_clear_error();
        return st_err_set(err, ST_INVALID_ARGUMENT, "%s holds no PEM certificate", cert_path);
    }
    /* X509_cmp_current_time: -1 when the time is before now, 1 after, 0 on a malformed time */
    int before = X509_cmp_current_time(X509_get0_notBefore(x));
    int after = X509_cmp_current_time(X509_get0_notAfter(x));
    st_code rc = ST_OK;
    if (before >= 0 || after <= 0) {
        char nb[64], na[64];
        tls_time_text(X509_get0_notBefore(x), nb, sizeof nb);
        tls_time_text(X509_get0_notAfter(x), na, sizeof na);
        char renew[ST_ERR_MSG_MAX];
        tls_renew_text(cert_path, renew, sizeof renew);
        rc = st_err_set(err, ST_FAILED_PRECONDITION, "the certificate %s %s: valid from %s to %s%s",
                        cert_path,
                        after < 0    ? "has expired"
                        : before > 0 ? "is not yet valid (check this host's clock)"
                                     : "has a malformed validity date",
                        nb, na, renew);
    }
    X509_free(x);
    return rc;
}
