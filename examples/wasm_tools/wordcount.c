/* Example WASM tool: reads {"text": "..."} on stdin and answers {"bytes": N, "words": M}, the
   UTF-8 bytes of the text and its whitespace-separated words. Other keys are ignored. Input
   that is not a JSON object with a "text" string exits 2 with {"error": REASON}.
   The JSON is read as it streams in, so the input's size costs no memory. */
#include <stdio.h>
#include <string.h>

static long bytes, words;
static int in_word, held = EOF, holding;

static int next(void) {
    if (holding) { holding = 0; return held; }
    return getchar();
}
static void unread(int c) { held = c; holding = 1; }
static int skip_ws(void) {
    int c;
    do c = next(); while (c == ' ' || c == '\t' || c == '\n' || c == '\r');
    return c;
}
/* why is JSON-escaped already. */
static int bad(const char *why) {
    printf("{\"error\": \"wordcount: %s\"}\n", why);
    return 2;
}

/* One character of the text (n of its UTF-8 bytes): counts it when `count` is set. */
static void take(int count, int space, int n) {
    if (!count) return;
    bytes += n;
    if (space) in_word = 0;
    else if (!in_word) { in_word = 1; words++; }
}

static int hex4(void) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = next(), d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The rest of a string whose opening quote was read. Counts its characters when `count`;
   copies it into key (up to keylen-1 bytes, NUL-terminated) when key is given. */
static int string(int count, char *key, size_t keylen) {
    size_t k = 0;
    for (;;) {
        int c = next();
        if (c == EOF) return -1;
        if (c == '"') break;
        if (c != '\\') {
            /* A raw byte: ASCII whitespace separates words; UTF-8 continuation bytes never start one. */
            int space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
            if (count) {
                bytes++;
                if (space) in_word = 0;
                else if ((c & 0xC0) != 0x80 && !in_word) { in_word = 1; words++; }
            }
            if (key && k + 1 < keylen) key[k++] = (char)c;
            else if (key) k = keylen;  /* too long to be a key we look for */
            continue;
        }
        c = next();
        if (key) k = keylen;  /* an escaped key is not one we look for */
        switch (c) {
        case '"': case '\\': case '/': take(count, 0, 1); break;
        case 'b': take(count, 0, 1); break;
        case 'f': case 'n': case 'r': case 't': take(count, 1, 1); break;
        case 'u': {
            int cp = hex4();
            if (cp < 0) return -1;
            if (cp >= 0xDC00 && cp <= 0xDFFF) break;  /* second half of a pair: counted with the first */
            int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : (cp >= 0xD800 && cp <= 0xDBFF) ? 4 : 3;
            take(count, cp == 0x20 || (cp >= 0x09 && cp <= 0x0D), n);
            break;
        }
        default: return -1;
        }
    }
    if (key) key[k < keylen ? k : 0] = 0;
    return 0;
}

/* Skip one JSON value whose first character is c (nested values included). */
static int skip_value(int c) {
    if (c == '"') return string(0, 0, 0);
    if (c == '{' || c == '[') {
        long depth = 1;
        while (depth > 0) {
            c = next();
            if (c == EOF) return -1;
            if (c == '"') { if (string(0, 0, 0) < 0) return -1; }
            else if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') depth--;
        }
        return 0;
    }
    if (c == EOF || c == ',' || c == '}' || c == ']' || c == ':') return -1;
    while (c != EOF && c != ',' && c != '}' && c != ']' && c != ' ' && c != '\t' && c != '\n' && c != '\r')
        c = next();
    unread(c);
    return 0;
}

int main(void) {
    const char *usage = "expected a JSON object with a \\\"text\\\" string, e.g. {\\\"text\\\": \\\"a b c\\\"}";
    int found = 0, c = skip_ws();
    if (c != '{') return bad(usage);
    c = skip_ws();
    if (c != '}') {
        for (;;) {
            char key[8];
            if (c != '"' || string(0, key, sizeof key) < 0) return bad("not valid JSON");
            if (skip_ws() != ':') return bad("not valid JSON");
            c = skip_ws();
            if (strcmp(key, "text") == 0) {
                if (c != '"') return bad("\\\"text\\\" must be a string");
                if (string(1, 0, 0) < 0) return bad("not valid JSON");
                found = 1;
            } else if (skip_value(c) < 0) {
                return bad("not valid JSON");
            }
            c = skip_ws();
            if (c == '}') break;
            if (c != ',') return bad("not valid JSON");
            c = skip_ws();
        }
    }
    if (!found) return bad(usage);
    printf("{\"bytes\": %ld, \"words\": %ld}\n", bytes, words);
    return 0;
}
