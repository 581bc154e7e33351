/* fuzz_bal_config.c - libFuzzer target: a BERT config.json, read by the one
 * reader the balancer and the device share (bal_bert_parse). A config it
 * accepts passes bal_bert_check and gives units; a refusal names the file
 * and holds no control byte. */
#include "fuzz_bal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fz_text(data, size);
    bal_bert b;
    sl_err err = {0};
    if (bal_bert_parse(&b, text, "config.json", &err) == 0) {
        REQUIRE(bal_bert_check(&b, &err) == 0);
        REQUIRE(b.layers >= 1 && b.layers <= BAL_MAX_LAYERS && b.hidden % b.heads == 0);
        REQUIRE(b.ln_eps > 0 && b.hidden_dropout >= 0 && b.hidden_dropout < 1);
        bal_unit *u = NULL;
        int n = 0, seq = b.max_pos < 16 ? b.max_pos : 16;
        REQUIRE(bal_bert_units(&b, 2, seq, &u, &n, &err) == 0);
        REQUIRE(n == b.layers + 2 && u[n - 1].out_bytes == 0 && u[0].param_bytes > 0);
        free(u);
    } else {
        fz_message_ok(&err);
        REQUIRE(strncmp(err.msg, "config.json:", 12) == 0);
    }
    free(text);
    return 0;
}
