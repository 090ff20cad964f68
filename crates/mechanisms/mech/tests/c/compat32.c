/* A 32-bit (compat-mode) target without the C library: built with
 * `-m32 -nostdlib -static`, it sleeps 10 ms at a time through `int $0x80`
 * forever. pagewise must refuse to make calls in it: a `syscall` borrowed
 * from its 32-bit vDSO would enter the 32-bit table. */
struct ts32 { long sec, nsec; };

void _start(void) {
    static struct ts32 t = {0, 10000000};
    for (;;) {
        long r;
        __asm__ volatile("int $0x80" : "=a"(r) : "a"(162), "b"(&t), "c"(0) : "memory");
        (void)r;
    }
}
