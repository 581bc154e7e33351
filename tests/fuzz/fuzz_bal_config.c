/* fuzz_bal_config.c - libFuzzer target: a BERT config.json, read by the one
 * reader the balancer and the device share (bal_bert_parse). A config it
 * accepts passes bal_bert_check and gives units; its class names are
 * num_labels of them or none; a config that can classify gives the
 * classification head's units; a refusal names the file and holds no
 * control byte. */
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
        REQUIRE(b.task == BAL_TASK_MLM && b.num_labels >= 1 && b.num_labels <= BAL_MAX_LABELS);
        char **names = NULL;
        int k = 0;
        REQUIRE(bal_bert_label_names(text, "config.json", &names, &k, &err) == 0);
        REQUIRE(k == 0 || k == b.num_labels);
        for (int i = 0; i < k; i++) {
            REQUIRE(names[i] && names[i][0]);
            free(names[i]);
        }
        free(names);
        b.task = BAL_TASK_CLASSIFY;
        if (b.num_labels >= 2 && (b.problem_type == BAL_PROBLEM_NONE ||
                                  b.problem_type == BAL_PROBLEM_SINGLE_LABEL)) {
            REQUIRE(bal_bert_units(&b, 2, seq, &u, &n, &err) == 0);
            double H = b.hidden, K = b.num_labels;
            REQUIRE(u[n - 1].param_bytes == (uint64_t)(4 * (H * H + H + K * H + K)));
            free(u);
        } else {
            REQUIRE(bal_bert_check(&b, &err) == -1);
        }
    } else {
        fz_message_ok(&err);
        REQUIRE(strncmp(err.msg, "config.json:", 12) == 0);
    }
    free(text);
    return 0;
}
