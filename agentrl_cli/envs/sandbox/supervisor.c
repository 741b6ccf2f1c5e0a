/* The in-sandbox supervisor, compiled: the job of supervisor.py (run one command per request in its
 * own session with the per-command CPU-time and address-space limits, a wall-clock deadline that
 * kills its process group, an output cap with a truncation flag) without starting an interpreter
 * in every sandbox: a Python start costs ~20 ms of CPU, this one well under 1 ms. The host compiles
 * it once per source (see sandbox.py) and falls back to supervisor.py without a C compiler.
 *
 * Requests (from the trusted host): "<length>\n" then fields, each "<length>:<bytes>":
 *   exec: "exec" id timeout output_limit cpu_time address_space cwd stdin argc argv... envc env...
 *         (numbers in decimal; cpu_time and address_space empty for none; env entries "KEY=VALUE")
 *   ping: "ping" id
 * Answers: one JSON line each. An exec answer carries "stdout_bytes" and "stderr_bytes" and is
 * followed by exactly that many raw bytes of output; the host decodes them (UTF-8, invalid bytes
 * replaced), so the answer is the one supervisor.py gives. Nothing here is trusted for isolation:
 * the host enforces the deadline from outside and destroys a sandbox whose supervisor stops
 * answering.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK 65536
#define STDIN_MAX 65536
#define MAX_FRAME (64u << 20)
#define DRAIN_AFTER_EXIT_S 0.05 /* background children may keep pipes open: stop when quiet this long after exit */
#define MAX_DRAIN_AFTER_EXIT_S 1.0 /* ... and in any case this long after exit */

extern char **environ;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void put(const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(1, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            _exit(0); /* the host is gone */
        }
        p += w;
        n -= (size_t)w;
    }
}

/* -- requests ------------------------------------------------------------------------------- */
static char inbuf[65536];
static size_t in_pos, in_len;

static int read_byte(void) {
    if (in_pos == in_len) {
        ssize_t r;
        do r = read(0, inbuf, sizeof inbuf); while (r < 0 && errno == EINTR);
        if (r <= 0) return -1;
        in_pos = 0;
        in_len = (size_t)r;
    }
    return (unsigned char)inbuf[in_pos++];
}

static int read_exact(char *dst, size_t n) {
    while (n > 0) {
        if (in_pos < in_len) {
            size_t k = in_len - in_pos < n ? in_len - in_pos : n;
            memcpy(dst, inbuf + in_pos, k);
            in_pos += k, dst += k, n -= k;
            continue;
        }
        ssize_t r = read(0, dst, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        dst += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The next frame in a malloc'd buffer (*len bytes); NULL at the end of input, "" for a malformed header. */
static char *read_frame(size_t *len) {
    size_t n = 0;
    int digits = 0, c;
    while ((c = read_byte()) != '\n') {
        if (c < 0) return NULL;
        if (c < '0' || c > '9' || n > MAX_FRAME) return NULL; /* not a frame: the stream cannot be trusted */
        n = n * 10 + (size_t)(c - '0');
        digits++;
    }
    if (!digits || n > MAX_FRAME) return NULL;
    char *buf = malloc(n + 1);
    if (!buf || read_exact(buf, n) < 0) return NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}

struct field { const char *p; size_t n; };

/* Fields of a frame; -1 when malformed. */
static int parse_fields(const char *p, size_t len, struct field *out, int max) {
    const char *end = p + len;
    int count = 0;
    while (p < end) {
        size_t n = 0;
        int digits = 0;
        while (p < end && *p >= '0' && *p <= '9' && digits < 10) n = n * 10 + (size_t)(*p++ - '0'), digits++;
        if (!digits || p >= end || *p != ':' || count >= max) return -1;
        p++;
        if ((size_t)(end - p) < n) return -1;
        out[count].p = p;
        out[count].n = n;
        count++;
        p += n;
    }
    return count;
}

static int field_is(struct field f, const char *s) { return f.n == strlen(s) && memcmp(f.p, s, f.n) == 0; }

static char *field_str(struct field f) { /* NUL-terminated copy; NULL if it holds a NUL byte */
    if (memchr(f.p, 0, f.n)) return NULL;
    return strndup(f.p, f.n);
}

static double field_num(struct field f, double fallback) {
    char tmp[64];
    if (f.n == 0 || f.n >= sizeof tmp) return fallback;
    memcpy(tmp, f.p, f.n);
    tmp[f.n] = 0;
    char *e;
    double v = strtod(tmp, &e);
    return *e ? fallback : v;
}

static void put_id(struct field id) { /* the request's id, echoed when it is a plain integer */
    int ok = id.n > 0 && id.n < 20;
    for (size_t i = 0; ok && i < id.n; i++) ok = (id.p[i] >= '0' && id.p[i] <= '9') || (i == 0 && id.p[i] == '-' && id.n > 1);
    if (ok) put(id.p, id.n);
    else put("null", 4);
}

static void answer_error(struct field id, const char *message) { /* message: plain ASCII, no quotes */
    put("{\"id\":", 6);
    put_id(id);
    put(",\"error\":\"", 10);
    put(message, strlen(message));
    put("\"}\n", 3);
}

/* -- one command ---------------------------------------------------------------------------- */
struct buffer { char *p; size_t n, cap; };

static void append(struct buffer *b, const char *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) _exit(1);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void child(char **argv, const char *cwd, char **envp, long cpu_time, long long address_space, int in_r,
                  int out_w, int err_w) {
    setsid();
    dup2(in_r, 0);
    dup2(out_w, 1);
    dup2(err_w, 2);
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0) {
        struct rlimit nofile;
        int top = getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < 65536 ? (int)nofile.rlim_cur : 65536;
        for (int fd = 3; fd < top; fd++) close(fd);
    }
    if (cpu_time > 0) {
        struct rlimit r = {(rlim_t)cpu_time, (rlim_t)cpu_time + 1};
        setrlimit(RLIMIT_CPU, &r);
    }
    if (address_space > 0) {
        struct rlimit r = {(rlim_t)address_space, (rlim_t)address_space};
        setrlimit(RLIMIT_AS, &r);
    }
    int adj = open("/proc/self/oom_score_adj", O_WRONLY); /* the command, not the supervisor, dies first */
    if (adj >= 0) {
        if (write(adj, "1000", 4) < 0) { /* best effort */ }
        close(adj);
    }
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_IGN); /* as under supervisor.py (Python ignores it): a write past the file-size limit fails with EFBIG */
    if (chdir(cwd) == 0) {
        environ = envp; /* execvp searches the command's own PATH, as os.execvpe does */
        execvp(argv[0], argv);
    }
    char msg[512];
    int n = snprintf(msg, sizeof msg, "sandbox: cannot run '%s': [Errno %d] %s\n", argv[0], errno, strerror(errno));
    if (n > 0 && write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0) { /* nothing to do */ }
    _exit(127);
}

static void run_exec(struct field *f, int count) {
    /* op id timeout output_limit cpu_time address_space cwd stdin argc argv... envc env... */
    struct field id = f[1];
    if (count < 9) { answer_error(id, "bad request: malformed exec"); return; }
    double timeout = field_num(f[2], 30.0);
    if (!(timeout > 0)) timeout = 30.0;
    double limit_d = field_num(f[3], 1 << 20);
    size_t limit = limit_d > 0 ? (size_t)limit_d : (size_t)1 << 20;
    long cpu_time = (long)field_num(f[4], 0);
    long long address_space = (long long)field_num(f[5], 0);
    int argc = (int)field_num(f[8], -1);
    if (argc < 1 || 9 + argc >= count) { answer_error(id, "argv must be a non-empty list of strings"); return; }
    int envc = (int)field_num(f[9 + argc], -1);
    if (envc < 0 || 10 + argc + envc != count) { answer_error(id, "bad request: malformed exec"); return; }
    char **argv = calloc((size_t)argc + 1, sizeof *argv), **envp = calloc((size_t)envc + 1, sizeof *envp);
    char *cwd = f[6].n ? field_str(f[6]) : strdup("/work");
    int bad = !argv || !envp || !cwd;
    for (int i = 0; !bad && i < argc; i++) bad = !(argv[i] = field_str(f[9 + i]));
    for (int i = 0; !bad && i < envc; i++) bad = !(envp[i] = field_str(f[10 + argc + i]));
    if (bad) { answer_error(id, "argv, env and cwd must be strings without NUL characters"); goto done; }

    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) { answer_error(id, "cannot create pipes"); goto done; }
    double t0 = now();
    pid_t pid = fork();
    if (pid == 0) child(argv, cwd, envp, cpu_time, address_space, in[0], out[1], err[1]);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(in[1]), close(out[0]), close(err[0]);
        answer_error(id, "cannot fork");
        goto done;
    }
    if (f[7].n) {
        fcntl(in[1], F_SETFL, O_NONBLOCK);
        if (write(in[1], f[7].p, f[7].n < STDIN_MAX ? f[7].n : STDIN_MAX) < 0) { /* the command did not read it */ }
    }
    close(in[1]);
    struct buffer bufs[2] = {{0}, {0}};
    struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    int open_fds = 2, truncated = 0, timed_out = 0, have_status = 0, status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    double deadline = t0 + timeout, exited_at = 0;
    static char chunk[READ_CHUNK];
    while (open_fds > 0) {
        double t = now();
        if (!have_status && wait4(pid, &status, WNOHANG, &ru) == pid) have_status = 1, exited_at = t;
        if (!have_status && t >= deadline) {
            timed_out = 1;
            killpg(pid, SIGKILL);
            break;
        }
        if (have_status && t - exited_at > MAX_DRAIN_AFTER_EXIT_S) break;
        double left = deadline - t > 0 ? deadline - t : 0, wait = have_status ? DRAIN_AFTER_EXIT_S : left < 0.05 ? left : 0.05;
        int ready = poll(fds, 2, (int)(wait * 1000 + 0.999)); /* milliseconds, rounded up */
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0 && have_status) break; /* quiet after exit: only background children still hold the pipes */
        for (int i = 0; i < 2 && ready > 0 && open_fds > 0; i++) {
            if (fds[i].fd < 0 || !fds[i].revents) continue;
            ssize_t r = read(fds[i].fd, chunk, sizeof chunk);
            if (r < 0) continue;
            if (r == 0) {
                fds[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t used = bufs[0].n + bufs[1].n, room = limit > used ? limit - used : 0;
            append(&bufs[i], chunk, (size_t)r < room ? (size_t)r : room);
            if ((size_t)r > room) {
                truncated = 1;
                killpg(pid, SIGKILL);
                open_fds = 0;
            }
        }
    }
    close(out[0]);
    close(err[0]);
    for (int i = 0; !have_status && !timed_out && !truncated && i < 50; i++) { /* pipes closed: it is exiting */
        if (wait4(pid, &status, WNOHANG, &ru) == pid) have_status = 1;
        else nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    if (!have_status) {
        killpg(pid, SIGKILL);
        while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
    }
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    char head[512], sigtext[16];
    snprintf(sigtext, sizeof sigtext, sig ? "%d" : "null", sig);
    put("{\"id\":", 6);
    put_id(id);
    int n = snprintf(head, sizeof head,
                     ",\"exit_code\":%d,\"signal\":%s,\"truncated\":%s,\"timed_out\":%s,\"duration_s\":%.6f,\"cpu_s\":%.6f,"
                     "\"max_rss_kb\":%ld,\"error\":null,\"stdout_bytes\":%zu,\"stderr_bytes\":%zu}\n",
                     WIFEXITED(status) ? WEXITSTATUS(status) : 128 + sig, sigtext, truncated ? "true" : "false",
                     timed_out ? "true" : "false", now() - t0,
                     ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
                     ru.ru_maxrss, bufs[0].n, bufs[1].n);
    put(head, (size_t)n);
    put(bufs[0].p, bufs[0].n);
    put(bufs[1].p, bufs[1].n);
    free(bufs[0].p);
    free(bufs[1].p);
done:
    for (int i = 0; argv && i < argc; i++) free(argv[i]);
    for (int i = 0; envp && i < envc; i++) free(envp[i]);
    free(argv);
    free(envp);
    free(cwd);
}

int main(void) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* commands (same user) cannot open our /proc fds */
    signal(SIGPIPE, SIG_DFL);
    char ready[64];
    put(ready, (size_t)snprintf(ready, sizeof ready, "{\"ready\":true,\"pid\":%d}\n", (int)getpid()));
    for (;;) {
        size_t len;
        char *frame = read_frame(&len);
        if (!frame) return 0;
        struct field f[4096];
        int count = parse_fields(frame, len, f, 4096);
        struct field none = {"", 0};
        if (count < 2) answer_error(none, "bad request: malformed frame");
        else if (field_is(f[0], "exec")) run_exec(f, count);
        else if (field_is(f[0], "ping")) {
            put("{\"pong\":true,\"id\":", 18);
            put_id(f[1]);
            put("}\n", 2);
        } else answer_error(f[1], "bad request: unknown op");
        free(frame);
    }
}
