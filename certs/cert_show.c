/* cert_show.c - what a PEM file holds, for people (skyloom certs show). */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "cert.h"
#include "cert_internal.h"

static void name_str(X509_NAME *n, char *out, size_t cap)
{
    BIO *b = BIO_new(BIO_s_mem());
    X509_NAME_print_ex(b, n, 0, XN_FLAG_RFC2253);
    int len = BIO_read(b, out, (int)cap - 1);
    out[len > 0 ? len : 0] = 0;
    BIO_free(b);
}

static void time_str(const ASN1_TIME *t, char *out, size_t cap)
{
    struct tm tm;
    if (ASN1_TIME_to_tm(t, &tm) == 1)
        strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
    else
        snprintf(out, cap, "?");
}

static json_t *describe(X509 *x)
{
    char subj[512], iss[512], nb[32], na[32], fp[CERT_HEX_LEN], serial[80] = "";
    name_str(X509_get_subject_name(x), subj, sizeof subj);
    name_str(X509_get_issuer_name(x), iss, sizeof iss);
    time_str(X509_get0_notBefore(x), nb, sizeof nb);
    time_str(X509_get0_notAfter(x), na, sizeof na);
    if (cert_x509_fingerprint(x, fp))
        snprintf(fp, sizeof fp, "unknown");
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
    char *hs = bn ? BN_bn2hex(bn) : NULL;
    if (hs)
        snprintf(serial, sizeof serial, "%s", hs);
    OPENSSL_free(hs);
    BN_free(bn);
    json_t *names = json_array();
    GENERAL_NAMES *gens = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; gens && i < sk_GENERAL_NAME_num(gens); i++) {
        GENERAL_NAME *g = sk_GENERAL_NAME_value(gens, i);
        char buf[300] = "";
        if (g->type == GEN_DNS) {
            char raw[256];
            snprintf(raw, sizeof raw, "%.*s", ASN1_STRING_length(g->d.dNSName),
                     (const char *)ASN1_STRING_get0_data(g->d.dNSName));
            char safe[260];
            snprintf(buf, sizeof buf, "DNS:%s", sl_escape_ctl(safe, sizeof safe, raw));
        } else if (g->type == GEN_IPADD) {
            const unsigned char *a = ASN1_STRING_get0_data(g->d.iPAddress);
            int l = ASN1_STRING_length(g->d.iPAddress);
            if (l == 4)
                snprintf(buf, sizeof buf, "IP:%u.%u.%u.%u", a[0], a[1], a[2], a[3]);
            else
                snprintf(buf, sizeof buf, "IP:(%d bytes)", l);
        }
        if (buf[0])
            json_array_append_new(names, json_string(buf));
    }
    GENERAL_NAMES_free(gens);
    EVP_PKEY *k = X509_get0_pubkey(x);
    char key[64];
    snprintf(key, sizeof key, "%s %d bits", k ? OBJ_nid2sn(EVP_PKEY_get_base_id(k)) : "?",
             k ? EVP_PKEY_get_bits(k) : 0);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o, s:s, s:b, s:s}", "subject", subj, "issuer",
                     iss, "serial", serial, "not_before", nb, "not_after", na, "names", names,
                     "sha256", fp, "ca", X509_check_ca(x) != 0, "key", key);
}

int cert_show(const char *path, int json, FILE *out, sl_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return sl_err_set(err, SL_EIO, "cannot open %s: %s", path, strerror(errno));
    json_t *all = json_array();
    X509 *x;
    while ((x = PEM_read_X509(f, NULL, NULL, NULL)) != NULL) {
        json_array_append_new(all, describe(x));
        X509_free(x);
    }
    ERR_clear_error();
    fclose(f);
    if (json_array_size(all) == 0) {
        json_decref(all);
        return sl_err_set(err, SL_ECORRUPT, "%s holds no PEM certificate", path);
    }
    if (json) {
        char *s = json_dumps(all, JSON_INDENT(2));
        fprintf(out, "%s\n", s);
        free(s);
    } else {
        size_t i;
        json_t *c;
        json_array_foreach(all, i, c)
        {
            if (i)
                fprintf(out, "\n");
            fprintf(out, "certificate %zu%s\n", i, json_is_true(json_object_get(c, "ca")) ? " (CA)" : "");
            static const char *const keys[] = {"subject", "issuer", "serial", "not_before",
                                               "not_after", "key", "sha256"};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                fprintf(out, "  %-11s %s\n", keys[k], json_string_value(json_object_get(c, keys[k])));
            json_t *names = json_object_get(c, "names");
            size_t j;
            json_t *nm;
            json_array_foreach(names, j, nm) fprintf(out, "  %-11s %s\n", j ? "" : "names",
                                                     json_string_value(nm));
        }
    }
    json_decref(all);
    return 0;
}
