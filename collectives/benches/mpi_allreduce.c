/* MPI_Allreduce timing with nccl-tests' arithmetic, for collectives/benches/compare.sh.
 *
 * usage: mpi_allreduce MINBYTES MAXBYTES FACTOR ITERS WARMUP
 * Prints one line per size: "size time_us algbw busbw" (GB/s, busbw = algbw * 2(n-1)/n), f32 sum,
 * out of place, timed as the mean over ITERS after WARMUP and averaged over ranks (as coll-perf and
 * nccl-tests do). The result is checked once per size; the last column counts wrong elements. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 6) {
        if (rank == 0) fprintf(stderr, "usage: %s MINBYTES MAXBYTES FACTOR ITERS WARMUP\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long minb = atol(argv[1]), maxb = atol(argv[2]), factor = atol(argv[3]);
    int iters = atoi(argv[4]), warmup = atoi(argv[5]);
    size_t maxc = (size_t)maxb / sizeof(float);
    float *send = malloc(maxc * sizeof(float)), *recv = malloc(maxc * sizeof(float));
    for (size_t i = 0; i < maxc; i++) send[i] = (float)((rank + 1) * (i % 7));
    for (long bytes = minb; bytes <= maxb; bytes *= factor) {
        int count = (int)(bytes / sizeof(float));
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tsum;
        MPI_Reduce(&t, &tsum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        double tavg = tsum / n;
        long wrong = 0;
        for (int i = 0; i < count; i++)
            if (recv[i] != (float)(n * (n + 1) / 2 * (i % 7))) wrong++;
        long total;
        MPI_Reduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = bytes / tavg / 1e9;
            printf("%ld %.2f %.5f %.5f %ld\n", bytes, tavg * 1e6, algbw,
                   algbw * 2.0 * (n - 1) / n, total);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
