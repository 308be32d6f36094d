/* The floor of replicated group commit on this machine: a server that does only the syscalls a replicated, fsynced
 * produce cannot avoid, so that `berth-bench --workload produce` can drive it exactly as it drives berth, at R = 1 and
 * at R = 3, and the R3/R1 ratio it reaches is the best any server could show here. Used by benches/replfloor.sh; not
 * part of berth.
 *
 *   replfloor serve PORT DIR [--followers P1,P2] [--majority K] [--ship-early] [--prealloc-mb M]
 *   replfloor follow PORT DIR [--prealloc-mb M]
 *
 * serve: an HTTP/1.1 keep-alive server on 127.0.0.1:PORT (canned replies, as benches/floor/floor.c). Each
 *   `POST /produce` body goes into the current batch, with a 16-byte record header. After the events of one
 *   epoll_wait round: one pwrite of the batch at the journal's end, one fdatasync (inline, on the loop thread), then
 *   - no followers (R = 1): every produce of the batch is answered;
 *   - followers (R = 3): the batch, prefixed by its sequence number and length, is queued on a persistent TCP link
 *     to each follower, and its produces wait until K followers (default 1: with the leader, 2 of 3 are durable) have
 *     acked a sequence >= the batch's. The loop keeps reading, writing and syncing later batches meanwhile.
 *   --ship-early queues the batch to the followers after its pwrite and before its fdatasync, so the leader's and
 *   the followers' syncs overlap (what a Raft leader may do); a batch is still answered only after the leader's own
 *   fdatasync, which is inline and so always done before the next round looks at acks.
 * follow: accepts the leader's link; per pass it reads whatever batches have arrived, makes one pwrite of them all,
 *   one fdatasync, and sends one 8-byte ack of the last complete batch's sequence number.
 *
 * The journal (DIR/journal) is zero-filled and synced before serving (as berth's segments are zeroed ahead), so an
 * fdatasync only flushes data, never a metadata journal commit; writes wrap to its start when it is full. A journal
 * already there and large enough is reused as it is (overwritten from its start), so runs need not write it again. Counters
 * (passes, fdatasyncs, records, bytes, and the time between the first and the last sync) go to stderr on SIGTERM.
 * It is a measuring stick, not a server: replies are canned, client sends are not retried when the socket buffer
 * is full, a client must not pipeline another request behind an unanswered produce (berth-bench does not), and a
 * request over 64 KiB closes its connection. The replication links do handle partial reads and writes: every
 * produce answered was fdatasynced on the leader and on K followers.
 *   cc -O2 -o replfloor benches/floor/replfloor.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAXFD 4096
#define BUF 65536
#define MAXF 4           /* followers */
#define RING 4096        /* batches awaiting acks (a power of two) */
#define LINK_HDR 12      /* replication frame: u64 sequence, u32 length, then the batch */
#define REC_HDR 16       /* journal record: u32 length, u32 connection, u64 sequence */

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static void die(const char *what) { perror(what); exit(1); }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* A growable byte buffer: the batch, a link's unsent bytes, a follower's unparsed input. */
struct buf { char *p; size_t len, cap, off; };
static void put(struct buf *b, const void *data, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2 + 4096;
    if (!(b->p = realloc(b->p, b->cap))) die("realloc");
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
}

/* The journal: zero-filled ahead, written at `at`, wrapping to 0. */
struct journal { int fd; off_t at, size; long long syncs, passes, records, bytes; double first, last; };
static void journal_open(struct journal *j, const char *dir, long mb) {
  char path[4096];
  snprintf(path, sizeof path, "%s/journal", dir);
  j->fd = open(path, O_CREAT | O_WRONLY, 0644);
  if (j->fd < 0) die(path);
  j->size = (off_t)mb << 20;
  struct stat st;
  if (fstat(j->fd, &st) == 0 && st.st_size >= j->size) return; /* written before (by a run or by dd): reused */
  char *zeros = calloc(1, 1 << 20);
  for (off_t at = 0; at < j->size; at += 1 << 20)
    if (pwrite(j->fd, zeros, 1 << 20, at) != 1 << 20) die("zero-fill");
  if (fsync(j->fd)) die("fsync");
  free(zeros);
}
/* One pwrite of n bytes at the journal's end (journal_sync is the fdatasync). */
static void journal_write(struct journal *j, const char *data, size_t n) {
  if (j->at + (off_t)n > j->size) j->at = 0;
  for (size_t done = 0; done < n;) {
    ssize_t w = pwrite(j->fd, data + done, n - done, j->at + (off_t)done);
    if (w < 0) die("pwrite");
    done += (size_t)w;
  }
  j->at += (off_t)n;
  j->bytes += (long long)n;
  j->passes++;
}
static void journal_sync(struct journal *j) {
  if (fdatasync(j->fd)) die("fdatasync");
  j->syncs++;
  j->last = now_s();
  if (j->syncs == 1) j->first = j->last;
}
static void report(const char *who, struct journal *j, const char *extra) {
  double span = j->last - j->first;
  fprintf(stderr,
          "%s: %lld passes, %lld fdatasyncs, %lld records, %lld bytes; %.3f s from first to last sync: %.0f "
          "fdatasyncs/s, %.2f records per sync%s\n",
          who, j->passes, j->syncs, j->records, j->bytes, span, span > 0 ? (j->syncs - 1) / span : 0.0,
          j->syncs ? (double)j->records / j->syncs : 0.0, extra);
}

static int listen_on(int port) {
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1024)) die("listen");
  return ls;
}

static void install_term(void) {
  struct sigaction sa = {.sa_handler = on_term}; /* no SA_RESTART: a blocked epoll_wait or recv returns EINTR */
  sigaction(SIGTERM, &sa, 0);
  sigaction(SIGINT, &sa, 0);
  signal(SIGPIPE, SIG_IGN);
}

/* ---------------------------------------------------------------- follower */

static int follow(int port, const char *dir, long mb) {
  struct journal j = {0};
  journal_open(&j, dir, mb);
  int ls = listen_on(port), one = 1, fd;
  fcntl(ls, F_SETFL, 0); /* a blocking accept: the leader's one link */
  install_term();
  while ((fd = accept(ls, 0, 0)) < 0) {
    if (stop) { report("follower", &j, ""); return 0; }
    if (errno != EINTR) die("accept");
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct buf in = {0}, out = {0};
  long long frames = 0;
  uint64_t acked = 0;
  in.cap = 1 << 20;
  in.p = malloc(in.cap);
  while (!stop) {
    /* Read what has arrived: one blocking recv; only a recv that filled the buffer may have left more behind. */
    int flags = 0;
    for (;;) {
      if (in.cap - in.len < BUF) { in.cap *= 2; if (!(in.p = realloc(in.p, in.cap))) die("realloc"); }
      ssize_t got = recv(fd, in.p + in.len, in.cap - in.len, flags);
      if (got < 0 && errno == EINTR) break;
      if (got < 0 && errno == EAGAIN) break;
      if (got < 0) die("recv");
      if (got == 0) { stop = 1; break; } /* the leader went away */
      in.len += (size_t)got;
      if (in.len < in.cap) break;
      flags = MSG_DONTWAIT;
    }
    /* Every complete batch in the input goes into one write; a partial one waits for the next pass. */
    out.len = 0;
    uint64_t last = acked;
    size_t at = 0;
    while (in.len - at >= LINK_HDR) {
      uint64_t seq;
      uint32_t len;
      memcpy(&seq, in.p + at, 8);
      memcpy(&len, in.p + at + 8, 4);
      if (in.len - at < LINK_HDR + (size_t)len) break;
      put(&out, in.p + at + LINK_HDR, len);
      for (size_t r = 0; r + REC_HDR <= len; j.records++) { /* for the counters only */
        uint32_t rec_len;
        memcpy(&rec_len, in.p + at + LINK_HDR + r, 4);
        r += REC_HDR + rec_len;
      }
      frames++;
      last = seq;
      at += LINK_HDR + len;
    }
    memmove(in.p, in.p + at, in.len - at);
    in.len -= at;
    if (!out.len) continue;
    journal_write(&j, out.p, out.len);
    journal_sync(&j);
    /* One ack of the last durable batch (a blocking send: the leader always reads its links). */
    acked = last;
    for (size_t done = 0; done < 8;) {
      ssize_t w = send(fd, (char *)&acked + done, 8 - done, 0);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) { stop = 1; break; }
      done += (size_t)w;
    }
  }
  char extra[128];
  snprintf(extra, sizeof extra, "; %lld batches from the leader, %.2f per pass", frames,
           j.passes ? (double)frames / j.passes : 0.0);
  report("follower", &j, extra);
  return 0;
}

/* ---------------------------------------------------------------- leader */

struct conn { char buf[BUF]; size_t len; unsigned gen; };
static struct conn *conns[MAXFD];
static unsigned gens[MAXFD];

/* A produce waiting for its reply: the connection's fd and generation (a closed fd may be reused). */
struct waiter { int fd; unsigned gen; };
struct batch { uint64_t seq; struct waiter *w; size_t n, cap; };
static struct batch ring[RING];
static uint64_t oldest = 1, next_seq = 1; /* ring holds seqs [oldest, next_seq) */

struct link { int fd; struct buf out; char in[8]; size_t in_len; uint64_t acked; int want_out; };

static const char PRODUCE[] = "HTTP/1.1 200 OK\r\ncontent-length: 26\r\ncontent-type: application/json\r\n"
                              "\r\n{\"offset\":0,\"partition\":0}";
static const char CREATED[] = "HTTP/1.1 201 Created\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";
static const char OTHER[] = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";

/* One complete request at the front of c->buf: its length (head and body), or 0 if more bytes are needed. */
static size_t complete(struct conn *c, size_t *head_len) {
  char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
  if (!end) return 0;
  size_t head = (size_t)(end - c->buf) + 4, body = 0;
  for (char *p = c->buf; p < end; p++)
    if ((p == c->buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) body = strtoul(p + 15, 0, 10);
  if (c->len < head + body) return 0;
  *head_len = head;
  return head + body;
}

static void link_flush(int ep, struct link *l) {
  while (l->out.off < l->out.len) {
    ssize_t w = send(l->fd, l->out.p + l->out.off, l->out.len - l->out.off, 0);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) break;
    if (w < 0) die("send to follower");
    l->out.off += (size_t)w;
  }
  if (l->out.off == l->out.len) l->out.off = l->out.len = 0;
  int want = l->out.len > 0;
  if (want != l->want_out) { /* ask for EPOLLOUT only while bytes are left */
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.fd = l->fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, l->fd, &ev);
    l->want_out = want;
  }
}

static int connect_to(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int tries = 0; tries < 200; tries++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fcntl(fd, F_SETFL, O_NONBLOCK);
      return fd;
    }
    close(fd);
    usleep(50000);
  }
  fprintf(stderr, "cannot reach follower on port %d\n", port);
  exit(1);
}

static int cmp_desc(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

static int serve(int port, const char *dir, long mb, int *fports, int nf, int majority, int ship_early) {
  struct journal j = {0};
  journal_open(&j, dir, mb);
  install_term();
  int ep = epoll_create1(0), one = 1;
  struct link links[MAXF] = {0};
  for (int i = 0; i < nf; i++) {
    links[i].fd = connect_to(fports[i]);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = links[i].fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, links[i].fd, &ev);
  }
  int ls = listen_on(port); /* after the links: a client that reaches the port finds the set complete */
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[256];
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  struct buf batch = {0};
  long long released = 0, rounds_waiting = 0, max_pending = 0;
  while (!stop) {
    int n = epoll_wait(ep, evs, 256, 100) /* a SIGTERM between the loop's check and the call is seen within 100 ms */;
    if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
    if (next_seq - oldest >= RING - 1) { fprintf(stderr, "too many batches awaiting acks\n"); exit(1); }
    struct batch *cur = &ring[next_seq % RING];
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == ls) {
        int c;
        while ((c = accept4(ls, 0, 0, SOCK_NONBLOCK)) >= 0) {
          if (c >= MAXFD) { close(c); continue; }
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[c] = calloc(1, sizeof(struct conn));
          conns[c]->gen = ++gens[c];
          struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      struct link *l = 0;
      for (int k = 0; k < nf; k++) if (links[k].fd == fd) l = &links[k];
      if (l) { /* a follower: acks in (8 bytes each, possibly split), unsent batch bytes out */
        if (evs[i].events & EPOLLOUT) link_flush(ep, l);
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
          char tmp[4096];
          ssize_t got = recv(fd, tmp, sizeof tmp, 0);
          if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
            fprintf(stderr, "leader: a follower went away; stopping\n");
            stop = 1;
            continue;
          }
          for (ssize_t k = 0; k < got; k++) {
            l->in[l->in_len++] = tmp[k];
            if (l->in_len == 8) {
              uint64_t seq;
              memcpy(&seq, l->in, 8);
              if (seq > l->acked) l->acked = seq;
              l->in_len = 0;
            }
          }
        }
        continue;
      }
      struct conn *c = conns[fd];
      ssize_t got = recv(fd, c->buf + c->len, BUF - c->len, 0);
      if (got <= 0) {
        if (got < 0 && errno == EAGAIN) continue;
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, 0);
        close(fd); free(c); conns[fd] = 0; continue;
      }
      c->len += (size_t)got;
      size_t used, head;
      while ((used = complete(c, &head)) > 0) {
        if (strncmp(c->buf, "POST /produce", 13) == 0) {
          /* Into the batch: a record header and the body; the reply waits for the batch's commit. */
          uint32_t len = (uint32_t)(used - head), who = (uint32_t)fd;
          char rec[REC_HDR];
          memcpy(rec, &len, 4);
          memcpy(rec + 4, &who, 4);
          memcpy(rec + 8, &next_seq, 8);
          put(&batch, rec, REC_HDR);
          put(&batch, c->buf + head, len);
          if (cur->n == cur->cap) {
            cur->cap = cur->cap ? cur->cap * 2 : 64;
            if (!(cur->w = realloc(cur->w, cur->cap * sizeof *cur->w))) die("realloc");
          }
          cur->w[cur->n++] = (struct waiter){fd, c->gen};
          j.records++;
        } else {
          const char *reply = strncmp(c->buf, "PUT /topics/", 12) == 0 ? CREATED : OTHER;
          send(fd, reply, strlen(reply), 0);
        }
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
      }
      if (c->len == BUF) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, 0); close(fd); free(c); conns[fd] = 0; }
    }

    /* The commit point: the highest sequence that `majority` followers have acked (everything at R = 1). */
    uint64_t committed = next_seq - 1;
    if (nf) {
      uint64_t acks[MAXF];
      for (int k = 0; k < nf; k++) acks[k] = links[k].acked;
      qsort(acks, (size_t)nf, sizeof acks[0], cmp_desc);
      committed = acks[majority - 1];
    }
    /* Answer the batches that are now on a majority, in order, before this round's sync. */
    for (; oldest <= committed && oldest < next_seq; oldest++) {
      struct batch *b = &ring[oldest % RING];
      for (size_t k = 0; k < b->n; k++) {
        struct waiter w = b->w[k];
        if (conns[w.fd] && conns[w.fd]->gen == w.gen) send(w.fd, PRODUCE, sizeof PRODUCE - 1, 0);
      }
      released += (long long)b->n;
      b->n = 0;
    }

    if (!batch.len) continue;
    /* Group commit of this round's produces: one pwrite, one fdatasync, then to the followers. */
    cur->seq = next_seq;
    journal_write(&j, batch.p, batch.len);
    uint64_t hdr_seq = next_seq;
    uint32_t hdr_len = (uint32_t)batch.len;
    if (nf && ship_early) {
      for (int k = 0; k < nf; k++) {
        put(&links[k].out, &hdr_seq, 8); put(&links[k].out, &hdr_len, 4); put(&links[k].out, batch.p, batch.len);
        link_flush(ep, &links[k]);
      }
    }
    journal_sync(&j);
    if (nf && !ship_early) {
      for (int k = 0; k < nf; k++) {
        put(&links[k].out, &hdr_seq, 8); put(&links[k].out, &hdr_len, 4); put(&links[k].out, batch.p, batch.len);
        link_flush(ep, &links[k]);
      }
    }
    batch.len = 0;
    next_seq++;
    if (!nf) { /* R = 1: durable here is committed */
      for (size_t k = 0; k < cur->n; k++) {
        struct waiter w = cur->w[k];
        if (conns[w.fd] && conns[w.fd]->gen == w.gen) send(w.fd, PRODUCE, sizeof PRODUCE - 1, 0);
      }
      released += (long long)cur->n;
      cur->n = 0;
      oldest = next_seq;
    } else {
      long long pending = (long long)(next_seq - oldest);
      if (pending > max_pending) max_pending = pending;
      rounds_waiting += pending;
    }
  }
  char extra[256];
  snprintf(extra, sizeof extra, "; %lld produces answered; %d followers, majority %d%s; %.2f batches awaiting acks "
           "per pass (max %lld)", released, nf, majority, ship_early ? ", ship-early" : "",
           j.passes ? (double)rounds_waiting / j.passes : 0.0, max_pending);
  report("leader", &j, extra);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[1], "serve") && strcmp(argv[1], "follow"))) {
    fprintf(stderr, "usage: replfloor serve PORT DIR [--followers P1,P2] [--majority K] [--ship-early] "
                    "[--prealloc-mb M]\n       replfloor follow PORT DIR [--prealloc-mb M]\n");
    return 2;
  }
  int port = atoi(argv[2]), fports[MAXF], nf = 0, majority = 1, ship_early = 0;
  long mb = 256;
  for (int i = 4; i < argc; i++) {
    if (!strcmp(argv[i], "--followers") && i + 1 < argc) {
      for (char *s = strtok(argv[++i], ","); s && nf < MAXF; s = strtok(0, ",")) fports[nf++] = atoi(s);
    } else if (!strcmp(argv[i], "--majority") && i + 1 < argc) majority = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ship-early")) ship_early = 1;
    else if (!strcmp(argv[i], "--prealloc-mb") && i + 1 < argc) mb = atol(argv[++i]);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if (nf && (majority < 1 || majority > nf)) { fprintf(stderr, "--majority must be 1..%d\n", nf); return 2; }
  if (!strcmp(argv[1], "follow")) return follow(port, argv[3], mb);
  return serve(port, argv[3], mb, fports, nf, majority, ship_early);
}
