/* Test tool that misbehaves on purpose, chosen by a word in its JSON input:
   "loop" spins forever, "bomb" allocates until it fails, "file" opens /etc/passwd,
   "flood" prints far too much, "garbage" prints
   non-JSON, "fail" exits 2, anything else echoes input. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, stdin);
    buf[n] = 0;
    if (strstr(buf, "loop")) { volatile unsigned long i = 0; for (;;) i++; }
    if (strstr(buf, "bomb")) {
        /* Chain the blocks so the compiler cannot drop the allocations. */
        void **head = 0;
        for (;;) { void **p = malloc(1 << 20); if (!p) { printf("{\"bomb\": \"malloc failed\"}"); return 3; } *p = head; head = p; }
    }
    if (strstr(buf, "file")) {
        int fd = open("/etc/passwd", O_RDONLY);
        FILE *f = fopen("data/hello.txt", "r");
        char line[64] = "";
        if (f) { fgets(line, sizeof line, f); line[strcspn(line, "\n\"\\")] = 0; }
        printf("{\"passwd_fd\": %d, \"data\": \"%s\"}", fd, line);
        return 0;
    }
    if (strstr(buf, "flood")) { for (;;) fputs("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", stdout); }
    if (strstr(buf, "garbage")) { puts("this is not JSON {"); return 0; }
    if (strstr(buf, "fail")) { puts("{}"); return 2; }
    fwrite(buf, 1, n, stdout);
    return 0;
}
