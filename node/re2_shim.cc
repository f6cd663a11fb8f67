// node/re2_shim.cc — RE2 behind a C interface (see re2_shim.h). The only C++ in Strata: keep it
// this small. No exception may cross into C, so every entry point catches everything.
#include "re2_shim.h"

#include <re2/re2.h>

#include <cstring>
#include <new>

struct node_re2 {
    re2::RE2 re;
    node_re2(const re2::StringPiece &pattern, const re2::RE2::Options &opts) : re(pattern, opts) {}
};

static void copy_msg(char *errbuf, size_t errbuf_len, const char *msg, size_t msg_len) {
    if (errbuf_len == 0)
        return;
    size_t n = msg_len < errbuf_len - 1 ? msg_len : errbuf_len - 1;
    std::memcpy(errbuf, msg, n);
    errbuf[n] = '\0';
}

extern "C" node_re2_status node_re2_compile(const uint8_t *pattern, size_t len, node_re2 **out,
                                            char *errbuf, size_t errbuf_len) {
    *out = nullptr;
    try {
        re2::RE2::Options opts;
        opts.set_encoding(re2::RE2::Options::EncodingLatin1); // bytes, not UTF-8
        opts.set_dot_nl(false);                               // `.` skips '\n'; `\C` is any byte
        opts.set_case_sensitive(true);
        opts.set_never_capture(true); // filters never read submatches
        opts.set_log_errors(false);   // errors go back to the client, not to stderr
        opts.set_max_mem(NODE_RE2_MEM_BYTES_MAX);
        re2::StringPiece pat(reinterpret_cast<const char *>(pattern), len);
        node_re2 *r = new node_re2(pat, opts);
        if (!r->re.ok()) {
            const std::string &msg = r->re.error();
            copy_msg(errbuf, errbuf_len, msg.data(), msg.size());
            delete r;
            return NODE_RE2_INVALID;
        }
        *out = r;
        return NODE_RE2_OK;
    } catch (const std::bad_alloc &) {
        static const char msg[] = "out of memory compiling the pattern";
        copy_msg(errbuf, errbuf_len, msg, sizeof msg - 1);
        return NODE_RE2_NOMEM;
    } catch (...) {
        static const char msg[] = "internal error compiling the pattern";
        copy_msg(errbuf, errbuf_len, msg, sizeof msg - 1);
        return NODE_RE2_INVALID;
    }
}

extern "C" bool node_re2_full_match(const node_re2 *re, const uint8_t *data, size_t len) {
    try {
        re2::StringPiece subject(reinterpret_cast<const char *>(data), len);
        return re2::RE2::FullMatch(subject, re->re);
    } catch (...) {
        return false; // RE2 does not throw while matching; this only keeps C safe
    }
}

extern "C" void node_re2_free(node_re2 *re) {
    delete re;
}
