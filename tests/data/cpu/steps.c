/* A CPU stand-in for a training loop: NVTX ranges "iteration N" around work and short sleeps,
 * so Nsight Systems 2022.4 records NVTX ranges and OS runtime calls (no CUDA). */
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double spin(long n) {
    double x = 0;
    for (long i = 0; i < n; i++) x += (double)i * 1e-9;
    return x;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 5;
    double acc = 0;
    for (int i = 1; i <= steps; i++) {
        char label[32];
        snprintf(label, sizeof label, "iteration %d", i);
        nvtxRangePushA(label);
        nvtxRangePushA("forward");
        acc += spin(2000000);
        nvtxRangePop();
        usleep(5000); /* a host-side wait the osrt trace shows */
        nvtxRangePop();
    }
    printf("%f\n", acc);
    return 0;
}
