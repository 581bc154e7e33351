/* cert_fetch.c - pinning the CA by fingerprint before a device has any
 * certificate (the same idea as kubeadm's --discovery-token-ca-cert-hash):
 * one TLS handshake without verification only to read the chain the
 * coordinator presents; the CA found in it is trusted only if its SHA-256
 * equals the fingerprint carried by the enrollment token. */
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "cert.h"
#include "cert_internal.h"

static int split_host_port(const char *hp, char *host, size_t cap, char *port, size_t pcap)
{
    const char *colon;
    if (hp[0] == '[') {
        const char *end = strchr(hp, ']');
        if (!end || end[1] != ':')
            return -1;
        if ((size_t)(end - hp - 1) >= cap)
            return -1;
        memcpy(host, hp + 1, (size_t)(end - hp - 1));
        host[end - hp - 1] = 0;
        colon = end + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || (size_t)(colon - hp) >= cap || colon == hp)
            return -1;
        memcpy(host, hp, (size_t)(colon - hp));
        host[colon - hp] = 0;
    }
    if (!colon[1] || strlen(colon + 1) >= pcap)
        return -1;
    strcpy(port, colon + 1);
    return 0;
}

static int dial(const char *host, const char *port, int timeout_ms, sl_err *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0)
        return sl_err_set(err, SL_EIO, "cannot resolve %s: %s", host, gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return sl_err_set(err, SL_EIO, "cannot connect to %s:%s: %s", host, port,
                          e ? strerror(e) : "no address");
    return fd;
}

int cert_fetch_ca(const char *host_port, const char *want_fp, const char *out_path, int timeout_ms,
                  sl_err *err)
{
    char host[256], port[16];
    if (split_host_port(host_port, host, sizeof host, port, sizeof port))
        return sl_err_set(err, SL_EINVAL, "coordinator address '%s' must be HOST:PORT", host_port);
    int fd = dial(host, port, timeout_ms, err);
    if (fd < 0)
        return -1;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL); /* pinned below instead */
    SSL_CTX_set_alpn_protos(ctx, (const unsigned char *)"\x02h2", 3);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, host);
    int rc = -1;
    if (SSL_connect(ssl) != 1) {
        cert_ssl_err(err, SL_EIO, "TLS handshake with the coordinator failed");
        goto out;
    }
    STACK_OF(X509) *chain = SSL_get_peer_cert_chain(ssl);
    int n = chain ? sk_X509_num(chain) : 0;
    if (n < 1) {
        sl_err_set(err, SL_EAUTH, "the coordinator presented no certificate");
        goto out;
    }
    X509 *leaf = sk_X509_value(chain, 0), *ca = NULL;
    char seen[CERT_HEX_LEN] = "none";
    for (int i = 0; i < n; i++) {
        X509 *x = sk_X509_value(chain, i);
        char fp[CERT_HEX_LEN];
        if (cert_x509_fingerprint(x, fp))
            continue;
        if (X509_check_ca(x))
            memcpy(seen, fp, sizeof fp);
        if (!strcmp(fp, want_fp)) {
            ca = x;
            break;
        }
    }
    if (!ca) {
        sl_err_set(err, SL_EAUTH,
                   "CA fingerprint mismatch: the coordinator's CA is %s but the token pins %s "
                   "(token from another PKI?)", seen, want_fp);
        goto out;
    }
    if (!X509_check_ca(ca) || X509_check_issued(ca, leaf) != X509_V_OK ||
        X509_verify(leaf, X509_get0_pubkey(ca)) != 1) {
        sl_err_set(err, SL_EAUTH, "the pinned CA did not sign the coordinator's certificate");
        goto out;
    }
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, ca);
    char *p;
    long len = BIO_get_mem_data(b, &p);
    rc = cert_write_new(out_path, p, (size_t)len, 0644, err);
    BIO_free(b);
out:
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    return rc;
}
