#!/usr/bin/env python3
"""BERT's BasicTokenizer and WordpieceTokenizer, transcribed from
google-research/bert tokenization.py (Python 3 only, no six), used as the
oracle for Skyloom's C tokenizer in test_tok_oracle.sh.

usage: bert_tokenization_ref.py TEXT_FILE cased|uncased [VOCAB]
Prints one basic-tokenizer word per line; with VOCAB the word, a tab and its
WordPiece ids separated by spaces. Or: bert_tokenization_ref.py --random OUT SEED N to
write N random characters drawn from many Unicode blocks. Or:
bert_tokenization_ref.py --lines TEXT_FILE cased|uncased VOCAB to print the WordPiece
ids of each line of the file (split at LF only) on one line, as skyloom data tokenize."""
import random
import sys
import unicodedata


def _is_whitespace(char):
    if char == " " or char == "\t" or char == "\n" or char == "\r":
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char):
    if char == "\t" or char == "\n" or char == "\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char):
    cp = ord(char)
    if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp):
    return ((0x4E00 <= cp <= 0x9FFF) or (0x3400 <= cp <= 0x4DBF) or (0x20000 <= cp <= 0x2A6DF)
            or (0x2A700 <= cp <= 0x2B73F) or (0x2B740 <= cp <= 0x2B81F)
            or (0x2B820 <= cp <= 0x2CEAF) or (0xF900 <= cp <= 0xFAFF)
            or (0x2F800 <= cp <= 0x2FA1F))


def whitespace_tokenize(text):
    text = text.strip()
    return text.split() if text else []


def _clean_text(text):
    output = []
    for char in text:
        cp = ord(char)
        if cp == 0 or cp == 0xfffd or _is_control(char):
            continue
        output.append(" " if _is_whitespace(char) else char)
    return "".join(output)


def _tokenize_chinese_chars(text):
    output = []
    for char in text:
        if _is_chinese_char(ord(char)):
            output += [" ", char, " "]
        else:
            output.append(char)
    return "".join(output)


def _run_strip_accents(text):
    text = unicodedata.normalize("NFD", text)
    return "".join(c for c in text if unicodedata.category(c) != "Mn")


def _run_split_on_punc(text):
    output = []
    start_new_word = True
    for char in text:
        if _is_punctuation(char):
            output.append([char])
            start_new_word = True
        else:
            if start_new_word:
                output.append([])
            start_new_word = False
            output[-1].append(char)
    return ["".join(x) for x in output]


def basic_tokenize(text, do_lower_case):
    text = _tokenize_chinese_chars(_clean_text(text))
    split_tokens = []
    for token in whitespace_tokenize(text):
        if do_lower_case:
            token = _run_strip_accents(token.lower())
        split_tokens.extend(_run_split_on_punc(token))
    return whitespace_tokenize(" ".join(split_tokens))


def wordpiece(token, vocab, unk="[UNK]", max_chars=100):
    chars = list(token)
    if len(chars) > max_chars:
        return [vocab[unk]]
    out, start = [], 0
    while start < len(chars):
        end, cur = len(chars), None
        while start < end:
            substr = "".join(chars[start:end])
            if start > 0:
                substr = "##" + substr
            if substr in vocab:
                cur = substr
                break
            end -= 1
        if cur is None:
            return [vocab[unk]]
        out.append(vocab[cur])
        start = end
    return out


def random_text(path, seed, n):
    blocks = [(0x20, 0x7F), (0x0, 0x20), (0xA0, 0x250), (0x370, 0x530), (0x590, 0x700),
              (0x900, 0xE00), (0x1100, 0x1200), (0x1E00, 0x2070), (0x2100, 0x2800),
              (0x3000, 0x3100), (0x4E00, 0x4F00), (0xAC00, 0xAD00), (0xE000, 0xE010),
              (0xF900, 0xFB00), (0xFE00, 0xFFF0), (0x1D400, 0x1D800), (0x1F300, 0x1FA00),
              (0x20000, 0x20100)]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo, hi = rng.choice(blocks)
        out.append(chr(rng.randrange(lo, hi)))
        if rng.random() < 0.15:
            out.append(" ")
    # Unicode 14 (Python 3.11) vs utf8proc's 15: leave out what 15 newly assigned.
    text = "".join(c for c in out if unicodedata.category(c) != "Cn")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def load_vocab(path):
    vocab = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    return vocab


def main():
    if sys.argv[1] == "--random":
        random_text(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    if sys.argv[1] == "--lines":
        vocab = load_vocab(sys.argv[4])
        with open(sys.argv[2], encoding="utf-8", newline="\n") as f:
            for line in f:
                ids = []
                for w in basic_tokenize(line, sys.argv[3] == "uncased"):
                    ids += wordpiece(w, vocab)
                sys.stdout.write(" ".join(str(i) for i in ids) + "\n")
        return
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read()
    words = basic_tokenize(text, sys.argv[2] == "uncased")
    out = sys.stdout
    if len(sys.argv) > 3:
        vocab = load_vocab(sys.argv[3])
        for w in words:
            out.write(w + "\t" + " ".join(str(i) for i in wordpiece(w, vocab)) + "\n")
    else:
        for w in words:
            out.write(w + "\n")


if __name__ == "__main__":
    main()
