#!/usr/bin/env bash
# What a user of the CLI meets around jobs, on loopback with a coordinator and
# real device processes: one device per state directory (a second refused
# naming the holder's pid, a new one starting once the first is gone); a
# device with --data but no --stage-listen says its data cannot serve a job,
# and a submit naming it (or an owner that is offline, or a dataset it does
# not serve) is refused at once; devices by name and their datasets in
# status; a shard of another vocabulary of the same size refused (--vocab,
# --vocab-hash, the vocab.txt beside --init); the export as a folder that
# eval, fill-mask and PyTorch load; job list and the dashboard with names;
# plain errors for an address with nothing behind it, the HTTP port, a bare
# host and another PKI, with no stray gRPC log line; SKYLOOM_COORDINATOR and
# SKYLOOM_PKI (an option wins) and job ids before or after options; option,
# config and export errors that name what is wrong; job metrics and job
# compare on two finished jobs (one of them with a Hugging Face config).
# usage: test_workflow.sh SKYLOOM SOURCE_ROOT
set -u
SK="$1"; src="$2"
unset SKYLOOM_COORDINATOR SKYLOOM_PKI
CL=$(mktemp -d /tmp/skyloom-flow-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
trap 'tmux -L skyloom-flow-$$ kill-server 2>/dev/null; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT
d=$CL
# one_line TEXT: TEXT is a single line (no gRPC log line beside the error)
one_line() { [ "$(printf '%s\n' "$1" | wc -l)" -eq 1 ]; }
export -f one_line

cl_shard "$src" || exit 1
cl_config "$d/cfg.json" 16 1 32
# a shard of another vocabulary of the same size (learnt from the docs alone)
cat "$src"/docs/*.md > "$d/other.txt"
"$SK" -q data vocab --corpus "$d/other.txt" --size "$CL_VOCAB" --out "$d/other-vocab.txt" >/dev/null
"$SK" -q data prepare --vocab "$d/other-vocab.txt" --in "$d/other.txt" --out "$d/other.shard" --seq 24 >/dev/null
vhash() { "$SK" data inspect "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["vocab_hash"])'; }
WIKI_HASH=$(vhash "$d/text.shard"); OTHER_HASH=$(vhash "$d/other.shard")
check "the two shards: vocabularies of one size, two hashes" \
    bash -c '[ "$(wc -l < "$0")" = "$(wc -l < "$1")" ] && [ -n "$2" ] && [ "$2" != "$3" ]' \
    "$d/vocab.txt" "$d/other-vocab.txt" "$WIKI_HASH" "$OTHER_HASH"
cl_start || exit 1
cl_device dev1 lab-a --threads 1 --name owner-a --data "wiki=$d/text.shard" --data "other=$d/other.shard" || exit 1; OWNER=$CL_ID
cl_wait_online 1 || exit 1

# ---- one device per state directory --------------------------------------------
P1=${CL_PID_OF[dev1]}
out=$(timeout 30 "$SK" device --coordinator "$CL_ADDR" --state "$d/dev1" --site lab-a \
      --stage-listen 127.0.0.1:0 2>&1); rc=$?
check "a second device on the same --state is refused at once, naming the first one's pid" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "skyloom device: the state directory .*/dev1 is in use by another device (pid $2)" <<<"$1"' \
    "$rc" "$out" "$P1"
check "the refused device left the first one's lock as it was" test "$(cat "$d/dev1/device.lock")" = "$P1"
check "the first device still runs" kill -0 "$P1"
cl_kill9 dev1
cl_restart dev1 || exit 1
check "once the first is gone (SIGKILL), a new device starts on the same --state" \
    cl_poll 30 bash -c '[ "$(grep -c "^device $1" "$0")" -eq 2 ]' "$d/dev1.log" "$OWNER"
port=$(sed -n 's/.*serving Stage .*port=\([0-9]*\).*/\1/p' "$d/dev1.log" | tail -1)
check "the new device is online at its new Stage address" \
    cl_poll 30 bash -c '"$0" status --coordinator "$1" --pki "$2" | grep -q "^$3 .*online .*127.0.0.1:$4 "' \
    "$SK" "$CL_ADDR" "$d/pki" "$OWNER" "$port"
check "its lock names its own pid" cl_poll 10 bash -c '[ "$(cat "$0" 2>/dev/null)" = "$1" ]' "$d/dev1/device.lock" "${CL_PID_OF[dev1]}"
check "no warning about --data for a device that serves Stage" bash -c '! grep -q "without --stage-listen" "$0"' "$d/dev1.log"

# ---- --data without --stage-listen; SKYLOOM_COORDINATOR for a device -------------
tok=$(SKYLOOM_PKI="$d/pki" "$SK" -q certs token --site lab-a); rc=$?
check "certs token takes the PKI from SKYLOOM_PKI" bash -c 'test $0 -eq 0 && grep -q "^skyloom1\." <<<"$1"' "$rc" "$tok"
out=$(SKYLOOM_COORDINATOR="$CL_ADDR" timeout 30 "$SK" device --token "$tok" --state "$d/nostage" \
      --site lab-a --data "wiki=$d/text.shard" --data "more=$d/text.shard" --once 2>"$d/nostage.err"); rc=$?
NOSTAGE=$(grep -o "^device d[0-9a-f]*" <<<"$out" | cut -d" " -f2)
check "a device takes the coordinator from SKYLOOM_COORDINATOR (enrolls, one heartbeat)" \
    bash -c 'test $0 -eq 0 && grep -q "^device d" <<<"$1"' "$rc" "$out"
check "with --data but no --stage-listen it warns at start that its data cannot serve a job" \
    grep -q "warn  device: --data without --stage-listen: this device serves no Stage, so no job can train on its data datasets=wiki,more" "$d/nostage.err"

# ---- connection mistakes, in words ---------------------------------------------
closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
out=$("$SK" job list --coordinator "127.0.0.1:$closed" --pki "$d/pki" 2>&1); rc=$?
check "nothing at the address: cannot reach, the address, which port is which" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "^skyloom job: cannot reach the coordinator at 127.0.0.1:$2 (connection refused): is it running? --coordinator is the coordinator.s gRPC address (its --listen, 7400 in the docs), not its HTTP dashboard.s (--http-listen, 7401)$" <<<"$1"' \
    "$rc" "$out" "$closed"
out=$("$SK" status --coordinator "$CL_HTTP" --pki "$d/pki" 2>&1); rc=$?
check "the HTTP port: an HTTP server, not a coordinator, which port is which; one line" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "^skyloom status: $2 is an HTTP server (the coordinator.s dashboard?), not a coordinator: --coordinator is the coordinator.s gRPC address (its --listen, 7400 in the docs), not its HTTP dashboard.s (--http-listen, 7401)$" <<<"$1"' \
    "$rc" "$out" "$CL_HTTP"
# a server that speaks neither TLS nor HTTP (it greets and hangs up)
python3 - "$d/other-port" <<'PY' &
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + ".tmp", "w").write("%d\n" % s.getsockname()[1]); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.settimeout(60)
while True:
    c, _ = s.accept(); c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"); c.close()
PY
OTHER=$!
CL_PIDS+=("$OTHER")
cl_poll 20 test -s "$d/other-port"
other="127.0.0.1:$(cat "$d/other-port" 2>/dev/null)"
out=$("$SK" job list --coordinator "$other" --pki "$d/pki" 2>&1); rc=$?
check "a server that is not TLS: answers, but not as a coordinator, which port is which; one line" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "^skyloom job: $2 answers, but not as a coordinator (\(the TLS handshake failed: wrong version number\|it closed the connection\)): --coordinator is the coordinator.s gRPC address" <<<"$1"' \
    "$rc" "$out" "$other"
bare() { # bare WHAT ARGS...: skyloom ARGS (with --coordinator 127.0.0.1) is refused
    local what=$1 out rc; shift
    out=$("$SK" "$@" 2>&1); rc=$?
    check "$what: a bare host is refused before dialling (exit 2), asking for HOST:PORT" \
        bash -c 'test $0 -eq 2 && one_line "$1" && grep -q ": --coordinator 127.0.0.1 has no port: give HOST:PORT" <<<"$1"' "$rc" "$out"
}
bare "job list" job list --coordinator 127.0.0.1 --pki "$d/pki"
bare "status" status --pki "$d/pki" --coordinator 127.0.0.1
bare "device" device --coordinator 127.0.0.1 --state "$d/bare" --site x
check "the refused device made no state directory" test ! -e "$d/bare"
"$SK" -q certs init --pki "$d/pki2" >/dev/null
out=$("$SK" job list --coordinator "$CL_ADDR" --pki "$d/pki2" 2>&1); rc=$?
check "another PKI: the coordinator's certificate is not signed by this --pki's CA" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "^skyloom job: the coordinator at $2 has a certificate that is not signed by the CA of --pki $3 ($3/ca.crt)" <<<"$1"' \
    "$rc" "$out" "$CL_ADDR" "$d/pki2"
out=$("$SK" -v job list --coordinator "$CL_ADDR" --pki "$d/pki2" 2>&1)
check "gRPC's own log line goes through our logger (with -v, at debug level)" \
    bash -c 'grep -q "debug grpc severity=E at=ssl_transport_security.cc:[0-9]* message=\"Handshake failed.*certificate verify failed" <<<"$0" && ! grep -q "^E[0-9]" <<<"$0"' "$out"

# ---- the environment, options anywhere ----------------------------------------------
export SKYLOOM_COORDINATOR="$CL_ADDR" SKYLOOM_PKI="$d/pki"
out=$("$SK" status --json 2>&1); rc=$?
check "status takes SKYLOOM_COORDINATOR and SKYLOOM_PKI" bash -c 'test $0 -eq 0 && grep -q "\"device_id\": \"$2\"" <<<"$1"' "$rc" "$out" "$OWNER"
out=$(SKYLOOM_COORDINATOR="127.0.0.1:$closed" "$SK" job list --json 2>&1); rc=$?
check "job list dials the address SKYLOOM_COORDINATOR names" \
    bash -c 'test $0 -eq 1 && grep -q "cannot reach the coordinator at 127.0.0.1:$2" <<<"$1"' "$rc" "$out" "$closed"
out=$(SKYLOOM_COORDINATOR="127.0.0.1:$closed" SKYLOOM_PKI="$d/pki2" "$SK" job list --json --coordinator "$CL_ADDR" --pki "$d/pki" 2>&1); rc=$?
check "--coordinator and --pki win over the environment" bash -c 'test $0 -eq 0 && grep -q "^\[" <<<"$1"' "$rc" "$out"
out=$(SKYLOOM_PKI= "$SK" job list 2>&1); rc=$?
check "an empty SKYLOOM_PKI is no PKI: exit 2 naming --pki and the variable" \
    bash -c 'test $0 -eq 2 && grep -q "skyloom job: --pki is required (or the environment variable SKYLOOM_PKI)" <<<"$1"' "$rc" "$out"
out=$("$SK" coordinator --listen 127.0.0.1:0 --state "$d/coord2" 2>&1); rc=$?
check "the coordinator takes its --pki from SKYLOOM_PKI (this one is in use: refused)" \
    bash -c 'test $0 -eq 1 && grep -q "PKI directory $2 is in use by another coordinator" <<<"$1"' "$rc" "$out" "$d/pki"

# ---- option and config errors that name what is wrong ------------------------------
njobs() { "$SK" job list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }
before=$(njobs)
sub() { "$SK" job submit --data "$OWNER:wiki" --steps 3 "$@" 2>&1; }
out=$(sub --config "$d/cfg.json" --codec-act int4); rc=$?
check "--codec-act int4: exit 2 naming --codec-act only" \
    bash -c 'test $0 -eq 2 && one_line "$1" && grep -q "^skyloom job: --codec-act .int4. is not a codec for activations (none, fp16, bf16, int8)$" <<<"$1"' "$rc" "$out"
out=$(sub --config "$d/cfg.json" --codec-grad topk:1.5); rc=$?
check "--codec-grad topk:1.5: exit 2 naming --codec-grad and topk's range" \
    bash -c 'test $0 -eq 2 && grep -q "^skyloom job: --codec-grad .topk:1.5. is not a codec for gradients (none, fp16, bf16, int8, topk:F with 0 < F <= 1)$" <<<"$1"' "$rc" "$out"
sed 's/"num_hidden_layers": 1/"num_hidden_layers": 0/' "$d/cfg.json" > "$d/my-bert.json"
out=$(sub --config "$d/my-bert.json"); rc=$?
check "a config error cites the file's own name and line, not config.json:1 behind the coordinator's address" \
    bash -c 'test $0 -eq 1 && grep -q "^skyloom job: $2:1: num_hidden_layers: must be between 1 and 256, got 0$" <<<"$1" && ! grep -q "INVALID_ARGUMENT\|config.json" <<<"$1"' \
    "$rc" "$out" "$d/my-bert.json"
python3 - "$d/cfg.json" "$d/typo.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hiden_layers"] = c.pop("num_hidden_layers")
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
out=$(sub --config "$d/typo.json"); rc=$?
check "a misspelled key is refused, named, with the nearest known key" \
    bash -c 'test $0 -eq 1 && grep -q "^skyloom job: $2:[0-9]*: num_hiden_layers: unknown key; did you mean num_hidden_layers?$" <<<"$1"' \
    "$rc" "$out" "$d/typo.json"
# the data owner's policy (its defaults: labels at home, frames sealed), known from its heartbeats
out=$(sub --config "$d/cfg.json" --no-u-shape); rc=$?
check "--no-u-shape against an owner that keeps its labels: refused at submit, naming the option and what lifts it" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "^skyloom job: .*the data owner.s policy keeps its labels and the head at home: drop --no-u-shape (or its device runs with --allow-labels-out) (owner $2)$" <<<"$1"' "$rc" "$out" "$OWNER"
out=$(sub --config "$d/cfg.json" --no-seal); rc=$?
check "--no-seal against an owner that keeps its frames sealed: refused at submit" \
    bash -c 'test $0 -eq 1 && grep -q "drop --no-seal (or its device runs with --allow-unsealed)" <<<"$1"' "$rc" "$out"
out=$("$SK" device --coordinator 127.0.0.1:1 --state "$d/x" --site s --home-layers -1 2>&1); rc=$?
check "--home-layers -1: exit 2 naming the option" \
    bash -c 'test $0 -eq 2 && grep -q "^skyloom device: --home-layers" <<<"$1"' "$rc" "$out"
check "none of these reached the coordinator (no job was made)" test "$(njobs)" = "$before"
# a config as Hugging Face's BertConfig writes it (transformers 4.x), sized for this shard
python3 - "$d/cfg.json" "$d/hf/config.json" <<'PY'
import json, os, sys
c = json.load(open(sys.argv[1]))
c.update({"_name_or_path": "bert-base-uncased", "architectures": ["BertForMaskedLM"],
          "model_type": "bert", "transformers_version": "4.36.2", "pad_token_id": 0,
          "position_embedding_type": "absolute", "use_cache": True, "classifier_dropout": None,
          "torch_dtype": "float32", "gradient_checkpointing": False, "initializer_range": 0.02,
          "layer_norm_eps": 1e-12, "hidden_act": "gelu", "type_vocab_size": 2,
          "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
          "num_labels": 2, "problem_type": None, "tie_word_embeddings": True,
          "directionality": "bidi", "pooler_type": "first_token_transform",
          "pooler_fc_size": 768, "pooler_num_attention_heads": 12, "pooler_num_fc_layers": 3,
          "pooler_size_per_head": 128})
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY

# ---- owners that cannot check: refused at once, with the reason -----------------------
tok=$("$SK" -q certs token --site lab-a)
"$SK" device --token "$tok" --state "$d/bare2" --site lab-a --data "wiki=$d/text.shard" >>"$d/bare2.log" 2>&1 &
CL_PIDS+=($!)
cl_poll 30 grep -qs "^device d" "$d/bare2.log" || echo "FAIL the device without Stage did not start"
BARE=$(grep "^device d" "$d/bare2.log" | head -1 | cut -d" " -f2)
cl_poll 30 bash -c '"$0" status --json | grep -q "\"name\": \"wiki\""' "$SK"
before=$(njobs)
out=$(timeout 20 "$SK" job submit --config "$d/cfg.json" --data "$BARE:wiki" --steps 3 2>&1); rc=$?
check "an owner online without a Stage service: refused at once (FAILED_PRECONDITION), saying so" \
    bash -c 'test $0 -eq 1 && one_line "$1" && grep -q "the data owner $2 serves no Stage (its skyloom device runs without --stage-listen), so it cannot take part in a job" <<<"$1"' "$rc" "$out" "$BARE"
offline() { "$SK" status --json | python3 -c 'import json,sys; print([d["state"] for d in json.load(sys.stdin)["devices"] if d["device_id"] == sys.argv[1]][0])' "$1" | grep -qx offline; }
cl_poll 30 offline "$NOSTAGE"
out=$(timeout 20 "$SK" job submit --config "$d/cfg.json" --data "$NOSTAGE:wiki" --steps 3 2>&1); rc=$?
check "an owner the coordinator knows is offline: refused at once, with its last heartbeat's age" \
    bash -c 'test $0 -eq 1 && grep -q "the data owner $2 is offline: its last heartbeat was [0-9]* s ago" <<<"$1"' "$rc" "$out" "$NOSTAGE"
out=$(timeout 20 "$SK" job submit --config "$d/cfg.json" --data "$OWNER:nothere" --steps 3 2>&1); rc=$?
check "a dataset the owner does not serve: refused at once, listing what it serves" \
    bash -c 'test $0 -eq 1 && grep -q "the data owner $2 serves no dataset .nothere. (it serves wiki, other)" <<<"$1"' "$rc" "$out" "$OWNER"
check "no job was made for them (job list unchanged)" test "$(njobs)" = "$before"

# ---- devices by name; the datasets they serve -------------------------------------------
"$SK" status > "$d/status0.txt"; "$SK" status --json > "$d/status0.json"
check "status: each device's name and the datasets it serves (text)" \
    bash -c 'grep -q "^$1  *owner-a  *lab-a  *online .* wiki,other " "$0" && grep -q "^$2 .* wiki " "$0" && grep -q "^  $1:wiki  not checked for a job yet" "$0"' \
    "$d/status0.txt" "$OWNER" "$BARE"
check "status --json: names, and datasets by name before any check" python3 - "$d/status0.json" "$OWNER" <<'PY'
import json, sys
devs = {d["device_id"]: d for d in json.load(open(sys.argv[1]))["devices"]}
o = devs[sys.argv[2]]
assert o["name"] == "owner-a" and o["datasets"] == [{"name": "wiki"}, {"name": "other"}], o
PY
HOSTNAME_OF_BARE=$(python3 -c 'import json,sys; print([d["name"] for d in json.load(open(sys.argv[1]))["devices"] if d["device_id"] == sys.argv[2]][0])' "$d/status0.json" "$BARE")
out=$("$SK" job submit --config "$d/cfg.json" --data "$HOSTNAME_OF_BARE:wiki" --steps 3 2>&1); rc=$?
check "--data NAME:dataset with a name two devices have: refused, listing their ids" \
    bash -c 'test $0 -eq 1 && grep -q "devices are named .$2. (.*$3.*): give the device id instead of the name" <<<"$1"' "$rc" "$out" "$HOSTNAME_OF_BARE" "$BARE"
out=$("$SK" job submit --config "$d/cfg.json" --data "nobody:wiki" --steps 3 2>&1); rc=$?
check "--data with a name no device has: refused" bash -c 'test $0 -eq 1 && grep -q "no enrolled device is named .nobody." <<<"$1"' "$rc" "$out"

# ---- a shard of another vocabulary of the same size ---------------------------------------
out=$("$SK" job submit --config "$d/cfg.json" --data "owner-a:other" --steps 3 --vocab "$d/vocab.txt" 2>&1); rc=$?
check "--vocab FILE: a shard built with another vocabulary of the same size is refused, naming both hashes" \
    bash -c 'test $0 -eq 1 && grep -q "refused other: the shard of .other. was built with the vocabulary $2, not the job.s $3" <<<"$1"' "$rc" "$out" "$OTHER_HASH" "$WIKI_HASH"
out=$("$SK" job submit --config "$d/cfg.json" --data "owner-a:other" --steps 3 --vocab-hash "$WIKI_HASH" 2>&1); rc=$?
check "--vocab-hash: the same refusal" bash -c 'test $0 -eq 1 && grep -q "built with the vocabulary $2" <<<"$1"' "$rc" "$out" "$OTHER_HASH"
out=$("$SK" job submit --config "$d/cfg.json" --data "owner-a:other" --steps 3 --vocab "$d/vocab.txt" --vocab-hash "$OTHER_HASH" 2>&1); rc=$?
check "--vocab and --vocab-hash naming two vocabularies: exit 2" bash -c 'test $0 -eq 2 && grep -q "name two vocabularies" <<<"$1"' "$rc" "$out"
out=$("$SK" job submit --config "$d/cfg.json" --data "owner-a:other" --steps 3 --vocab-hash xyz 2>&1); rc=$?
check "--vocab-hash that is not a hash: refused naming it" bash -c 'test $0 -eq 1 && grep -q "vocab_hash must be 64 lower-case hex digits" <<<"$1"' "$rc" "$out"
check "the refused submits are not in job list" test "$(njobs)" = "$before"

# ---- two finished jobs: metrics and compare ------------------------------------------
# job NAME ARGS...: submits, waits, and follows it to its end; its id in JOB
job() {
  local name=$1; shift
  "$SK" job submit --data "owner-a:wiki" --batch 4 "$@" > "$d/$name.submit" 2>&1
  JOB=$(grep -x 'j[0-9a-f]*' "$d/$name.submit")
  "$SK" job watch "$JOB" > "$d/$name.watch" 2>&1
  check "$name: submitted and done" bash -c '[ -n "$0" ] && grep -q "done after" "$1"' "$JOB" "$d/$name.watch"
}
job a --config "$d/cfg.json" --steps 5 --lr 1e-3 --checkpoint-every 2 --name run-a --tag base --tag lr=1e-3 --vocab "$d/vocab.txt"; A=$JOB
job b --config "$d/hf/config.json" --steps 7 --lr 2e-3 --seed 9 --checkpoint-every 0; B=$JOB
"$SK" job metrics "$A" > "$d/a.metrics"; rc=$?
check "job metrics prints the job's metrics.csv as the coordinator wrote it (header and rows)" \
    bash -c 'test $0 -eq 0 && cmp -s "$1" "$2"' "$rc" "$d/a.metrics" "$d/coord/jobs/$A/metrics.csv"
check "job metrics: the header, then one row per step, steps 1..5 in order" \
    bash -c 'head -1 "$0" | grep -q "^step,epoch,loss,masked,grad_norm," && [ "$(tail -n +2 "$0" | cut -d, -f1 | tr "\n" " ")" = "1 2 3 4 5 " ]' "$d/a.metrics"
"$SK" job metrics --coordinator "$CL_ADDR" --pki "$d/pki" "$B" > "$d/b.metrics"; rc=$?
check "job metrics with options before the job id; 7 rows for the 7-step job" \
    bash -c 'test $0 -eq 0 && [ "$(tail -n +2 "$1" | wc -l)" -eq 7 ]' "$rc" "$d/b.metrics"
"$SK" job status "$A" --json > "$d/a1.json"; rc1=$?
"$SK" job status --json "$A" > "$d/a2.json"; rc2=$?
check "job status JOB --json and --json JOB: the same" \
    bash -c 'test $0 -eq 0 -a $1 -eq 0 && grep -q "\"job_id\": \"$4\"" "$2" && cmp -s "$2" "$3"' "$rc1" "$rc2" "$d/a1.json" "$d/a2.json" "$A"

# ---- the export: a folder that eval, fill-mask and PyTorch load as it is ------------------
"$SK" job export "$A" --out "$d/a.export" > "$d/a.export.txt" 2>&1; rc=$?
check "export: model, config, vocabulary, tokenizer config and training.json in one folder" \
    bash -c 'test $0 -eq 0 && grep -q "exported to $1 (model.safetensors, config.json, vocab.txt, tokenizer_config.json, special_tokens_map.json, training.json)$" "$2"' \
    "$rc" "$d/a.export" "$d/a.export.txt"
check "config.json: floats as the shortest text that reads back as the same float (1e-12, 0.1, 0.02)" \
    bash -c 'grep -q "\"layer_norm_eps\": 1e-12," "$0" && grep -q "\"hidden_dropout_prob\": 0.1," "$0" && grep -q "\"initializer_range\": 0.02$" "$0" && ! grep -q "9999\|0000001" "$0"' \
    "$d/a.export/config.json"
check "vocab.txt is the shard's vocabulary, byte for byte" cmp -s "$d/a.export/vocab.txt" "$d/vocab.txt"
VERSION=$("$SK" --version | head -1 | awk '{print $2}')
check "training.json: the options, the data and vocabulary hashes, the step, the name and Skyloom's version; the tokenizer's config as BertTokenizer reads it" \
    python3 - "$d/a.export" "$A" "$OWNER" "$WIKI_HASH" "$VERSION" <<'PY'
import json, os, re, sys
d, job, owner, vh, version = sys.argv[1:]
t = json.load(open(os.path.join(d, "training.json")))
assert t["job_id"] == job and t["name"] == "run-a" and t["tags"] == ["base", "lr=1e-3"], t
assert t["step"] == 5 and t["steps"] == 5 and t["skyloom_version"] == version, t
assert t["options"]["lr"] == 0.001 and t["options"]["batch"] == 4 and t["options"]["vocab_hash"] == vh, t
assert t["vocab_hash"] == vh and len(t["data"]) == 1, t
x = t["data"][0]
assert x["owner"] == owner and x["dataset"] == "wiki" and x["vocab_hash"] == vh, x
assert re.fullmatch("[0-9a-f]{64}", x["shard_hash"]) and x["seq_len"] == 24 and x["vocab_size"] == 400, x
tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
assert tc["tokenizer_class"] == "BertTokenizer" and tc["do_lower_case"] is True, tc
assert tc["model_max_length"] == 24 and tc["mask_token"] == "[MASK]" and tc["unk_token"] == "[UNK]", tc
sm = json.load(open(os.path.join(d, "special_tokens_map.json")))
assert sm == {k: tc[k] for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")}, sm
c = json.load(open(os.path.join(d, "config.json")))
assert c["layer_norm_eps"] == 1e-12 and c["architectures"] == ["BertForMaskedLM"], c
PY
"$SK" -q eval --model "$d/a.export" --data "$d/text.shard" --batches 2 --batch 4 --json > "$d/eval-dir.json"; rc=$?
"$SK" -q eval --config "$d/a.export/config.json" --model "$d/a.export/model.safetensors" --data "$d/text.shard" \
    --batches 2 --batch 4 --json > "$d/eval-files.json"
check "eval --model DIR: the folder as it is, the same result as naming its files" \
    bash -c 'test $0 -eq 0 && grep -q "\"loss\"" "$1" && cmp -s "$1" "$2"' "$rc" "$d/eval-dir.json" "$d/eval-files.json"
text="the [MASK] of a job is the plan"
"$SK" -q fill-mask --model "$d/a.export" --text "$text" --json --logits "$d/fm.f32" > "$d/fm.json"; rc=$?
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  check "fill-mask --model DIR, and PyTorch loading the folder as it is (config, vocabulary, safetensors) agree" \
      bash -c 'test $0 -eq 0 && /usr/bin/python3 "$1/tests/ref/fill_mask_ref.py" check "$2" "$3" 5 uncased "$4" "$5"' \
      "$rc" "$src" "$d/a.export" "$text" "$d/fm.json" "$d/fm.f32"
else
  echo "skip PyTorch on the exported folder: python3-torch missing (make deps)"
fi

out=$("$SK" job submit --config "$d/a.export/config.json" --data "owner-a:other" --steps 3 --init "$d/a.export" 2>&1); rc=$?
check "--init DIR (an export): the vocab.txt beside the model is the vocabulary the data must have" \
    bash -c 'test $0 -eq 1 && grep -q "built with the vocabulary $2, not the job.s $3 (--vocab-hash, --vocab or --init)" <<<"$1"' "$rc" "$out" "$OTHER_HASH" "$WIKI_HASH"
"$SK" status --json > "$d/status1.json"; "$SK" status > "$d/status1.txt"
check "status once checked: the dataset's sequences, length, vocabulary hash and the job it was checked for" \
    python3 - "$d/status1.json" "$OWNER" "$WIKI_HASH" "$B" "$(grep -c . "$d/vocab.txt")" \
        "$("$SK" data inspect "$d/text.shard" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequences"])')" <<'PY'
import json, sys
devs = {d["device_id"]: d for d in json.load(open(sys.argv[1]))["devices"]}
w, o = devs[sys.argv[2]]["datasets"]
assert w["name"] == "wiki" and w["vocab_hash"] == sys.argv[3] and w["job_id"] == sys.argv[4], w
assert w["sequences"] == int(sys.argv[6]), w
assert w["seq_len"] == 24 and w["vocab_size"] == int(sys.argv[5]) and w["checked_at"] > 0, w
assert o == {"name": "other"}, o  # its checks were refused
PY
check "status (text): the checked dataset's line" \
    bash -c 'grep -q "^  $1:wiki  [0-9]* sequences of 24 tokens, vocabulary 400 (hash ${2:0:16}...), checked for job $3$" "$0"' \
    "$d/status1.txt" "$OWNER" "$WIKI_HASH" "$B"

# ---- job list and the dashboard: name, config, data, start, duration, final loss -----------
"$SK" job list > "$d/list.txt"; "$SK" job list --json > "$d/list.json"
check "job list: the name, state, committed step, loss, config, data, start and wall time" \
    bash -c 'grep -q "^$1  *run-a  *done  *5/5  *5  *[0-9.]*  *L1 H16  *$2:wiki  *[0-9-]* [0-9:]*  *[0-9]*s  *$" "$0"' \
    "$d/list.txt" "$A" "$OWNER"
check "job list --json: name, tags, data, layers, hidden, start, end and wall time" python3 - "$d/list.json" "$A" "$OWNER" <<'PY'
import json, sys
j = {x["job_id"]: x for x in json.load(open(sys.argv[1]))}[sys.argv[2]]
assert j["name"] == "run-a" and j["tags"] == ["base", "lr=1e-3"] and j["data"] == [sys.argv[3] + ":wiki"], j
assert j["layers"] == 1 and j["hidden"] == 16 and j["ended_at"] >= j["created_at"] > 0, j
assert j["wall_s"] == j["ended_at"] - j["created_at"] and j["loss"] > 0, j
PY
check "the dashboard's job list: name, config, data, start and duration" \
    bash -c 'curl -sf "http://$0/" > "$1" && grep -q "<th>name</th>.*<th>config</th>.*<th>started</th><th>duration</th>" "$1" && grep -q "<td class=\"name\">run-a</td>.*<td>L1 H16</td>" "$1"' \
    "$CL_HTTP" "$d/dash.html"

"$SK" job compare "$A" "$B" --svg "$d/cmp.svg" > "$d/cmp.txt"; rc=$?
check "job compare writes one SVG: two curves with the jobs' step counts, a legend, step and loss axes" \
    python3 - "$d/cmp.svg" "$A" "$B" <<'PY'
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
lines = [p for p in root.iter(ns + "polyline") if p.get("class") == "curve"]
got = {p.get("data-job"): len(p.get("points").split()) for p in lines}
assert got == {sys.argv[2]: 5, sys.argv[3]: 7}, got
assert len({p.get("stroke") for p in lines}) == 2, "one colour per job"
texts = [t.text or "" for t in root.iter(ns + "text")]
assert "step" in texts and "loss" in texts, texts
legend = [t.text for t in root.iter(ns + "text") if t.get("class") == "legend"]
assert len(legend) == 2 and legend[0].startswith(sys.argv[2]) and legend[1].startswith(sys.argv[3]), legend
PY
check "job compare prints the options side by side, '*' on the rows that differ" \
    bash -c 'test $0 -eq 0 && grep -q "^  job  *$2  *$3$" "$1" && grep -q "^\* lr  *0.001  *0.002$" "$1" && grep -q "^\* steps  *5  *7$" "$1" && grep -q "^\* seed  *1  *9$" "$1" && grep -q "^  batch  *4  *4$" "$1" && grep -q "^  hidden_size  *16  *16$" "$1"' \
    "$rc" "$d/cmp.txt" "$A" "$B"
"$SK" job compare "$A" "$B" --json > "$d/cmp.json"; rc=$?
check "job compare --json: the differing options, and each job's curve" \
    python3 - "$d/cmp.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
d = set(j["differ"])
assert {"lr", "steps", "seed", "checkpoint_every"} <= d and "batch" not in d, d
assert [len(x["loss"]) for x in j["jobs"]] == [5, 7], [len(x["loss"]) for x in j["jobs"]]
PY
out=$("$SK" job compare "$A" 2>&1); rc=$?
check "job compare of one job: exit 2" bash -c 'test $0 -eq 2 && grep -q "two JOB ids or more" <<<"$1"' "$rc" "$out"
out=$("$SK" job compare "$A" jffffffffffffffff 2>&1); rc=$?
check "job compare of an unknown job: exit 1 naming it" bash -c 'test $0 -eq 1 && grep -q "no job .jffffffffffffffff." <<<"$1"' "$rc" "$out"

# ---- on a terminal (tmux): Ctrl-C of job submit, job watch from the first phase on -------
# The data owner is paused (SIGSTOP) right before the submit: the job stays in
# checking until it is let go, so each screen below is there for certain.
if command -v tmux >/dev/null; then
  TM="tmux -L skyloom-flow-$$ -f /dev/null"
  pane() { $TM capture-pane -p -S -50 -t "$1" 2>/dev/null; } # with what scrolled off
  shows() { pane "$1" | grep -q "$2"; }
  run_in() { # run_in WINDOW CMD: CMD in a pane of 200 x 12 that stays after it exits
    $TM new-session -d -s "$1" -x 200 -y 12 && $TM set-option -t "$1" remain-on-exit on >/dev/null &&
      $TM respawn-pane -k -t "$1" "$2"
  }
  P1=${CL_PID_OF[dev1]}
  kill -STOP "$P1"
  run_in sub "'$SK' job submit --coordinator '$CL_ADDR' --pki '$d/pki' --config '$d/cfg.json' --data owner-a:wiki --steps 12 --batch 4 --checkpoint-every 4 --name tty; echo exit=\$?"
  cl_poll 20 shows sub "job j[0-9a-f]*: checking"
  T=$(pane sub | grep -o "job j[0-9a-f]*: checking" | head -1 | cut -d" " -f2 | tr -d :)
  $TM send-keys -t sub C-c
  cl_poll 20 shows sub "exit="
  check "Ctrl-C of job submit: the job goes on, and the line says how to follow and stop it" \
      bash -c 'grep -q "job $1 goes on without this command: follow it with .skyloom job watch $1., stop it with .skyloom job stop $1." <<<"$0" && grep -q "exit=130" <<<"$0"' \
      "$(pane sub)" "$T"
  run_in watch "'$SK' job watch '$T' --coordinator '$CL_ADDR' --pki '$d/pki'; echo exit=\$?"
  cl_poll 20 shows watch "job $T  checking: the data owner $OWNER checks its dataset wiki  ([0-9]* s since submit)"
  check "job watch on a terminal: the phase while the data owner checks (no blank screen)" \
      shows watch "checking: the data owner $OWNER checks its dataset wiki"
  kill -CONT "$P1"
  cl_poll 60 shows watch "exit="
  pane watch > "$d/watch.screen"
  check "job watch on a terminal: the step line rewritten in place (the last step, its committed step, the loss and its EMA, tokens/s, ETA, the job's wall time, labelled busy shares)" \
      bash -c 'grep -q "^step 12/12  committed [0-9]*  loss [0-9.]* (ema [0-9.]*)  [0-9]* tok/s  ETA 0 s  wall [0-9]* s  busy s0 [0-9]*%" "$0" && [ "$(grep -c "^step " "$0")" = 1 ]' \
      "$d/watch.screen"
  check "job watch on a terminal: done after the job's own wall time, the committed step, exit 0" \
      bash -c 'grep -q "^job $1 done after [0-9]* s (from its submit), committed step 12$" "$0" && grep -q "^exit=0" "$0"' \
      "$d/watch.screen" "$T"
  "$SK" job watch "$T" > "$d/t.watch"
  check "job watch without a terminal: a line per step with loss_ema, committed, wall_s and labelled busy" \
      bash -c 'grep -q "^# loss_ema: exponential moving average of the loss, factor 0.10" "$0" && [ "$(grep -c "^step=" "$0")" = 12 ] && grep -q "^step=12 loss=[0-9.]* loss_ema=[0-9.]* tokens_per_s=[0-9]* eta_s=0 committed=12 wall_s=[0-9]* busy=s0:[0-9.]*$" "$0" && grep -q "^job $1 done after" "$0"' "$d/t.watch" "$T"
  $TM kill-server 2>/dev/null
else
  echo "skip the terminal checks: tmux missing"
fi

# ---- export before the first commit -------------------------------------------------
L=$("$SK" job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 100000 --batch 4 \
    --checkpoint-every 50000 --no-wait 2>"$d/long.err")
out=$("$SK" job export "$L" --out "$d/none" 2>&1); rc=$?
check "export before the first commit: says so, and when it commits (no NOT_FOUND, no 'no checkpoint at step 0')" \
    bash -c 'test $0 -eq 1 && grep -q "^skyloom job: job $2 has no committed step yet (it commits every 50000 steps; it is [a-z]*, at step [0-9]* of 100000)$" <<<"$1" && ! grep -q "NOT_FOUND\|no checkpoint" <<<"$1"' \
    "$rc" "$out" "$L"
"$SK" job stop "$L" >/dev/null
out=$("$SK" job export "$L" --out "$d/none" 2>&1); rc=$?
check "export of a job stopped before its first commit: says it stopped first" \
    bash -c 'test $0 -eq 1 && grep -q "^skyloom job: job $2 has no committed step: it stopped before its first commit (it commits every 50000 steps)$" <<<"$1"' \
    "$rc" "$out" "$L"

# ---- a federation: its data owners' shards must share one vocabulary -------------------
cl_device dev2 lab-b --threads 1 --name owner-b --data "other=$d/other.shard" || exit 1
cl_wait_online 2
out=$("$SK" job submit --config "$d/cfg.json" --data owner-a:wiki --data owner-b:other --owner-batch 2,2 \
      --steps 3 2>&1); rc=$?
check "two data owners whose shards have vocabularies of one size but two hashes: refused, naming the other owner's" \
    bash -c 'test $0 -eq 1 && grep -q "its shard.s vocabulary (hash [0-9a-f]*) is not the job.s ([0-9a-f]*, from the vocabulary of the data owner d[0-9a-f]*.s [a-z]*: the owners of a job share one)" <<<"$1"' "$rc" "$out"

cl_stop
exit $fail
