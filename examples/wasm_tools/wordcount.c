/* Example WASM tool: reads a JSON object on stdin, answers {"bytes": N, "words": M}
   counting the bytes of the input and whitespace-separated words in it. */
#include <ctype.h>
#include <stdio.h>

int main(void) {
    long bytes = 0, words = 0;
    int c, in_word = 0;
    while ((c = getchar()) != EOF) {
        bytes++;
        if (isspace(c)) in_word = 0;
        else if (!in_word) { in_word = 1; words++; }
    }
    printf("{\"bytes\": %ld, \"words\": %ld}\n", bytes, words);
    return 0;
}
