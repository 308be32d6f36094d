/* The kernel floor of one request/response exchange on this machine: a server that does nothing but the socket
 * work (epoll_wait, recv, send) and answers berth's version 1 requests with canned replies, so that `berth bench`
 * can drive it exactly as it drives berth and beanstalkd. Its CPU per cycle is what any server pays for the six TCP
 * segments of a produce -> consume -> ack cycle over loopback (the send also runs the client's receive path in the
 * server's context), with next to nothing in user space. Used by benches/unbatched_cpu.sh; not part of berth.
 * It is a measuring stick, not a server: replies are canned, a send is not retried when the socket buffer is full,
 * and a request over 64 KiB closes its connection.
 *   cc -O2 -o floor benches/floor/floor.c && taskset -c 0 ./floor 17800
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#define MAXFD 4096
#define BUF 65536

struct conn { char buf[BUF]; size_t len; };
static struct conn *conns[MAXFD];

static const char PRODUCE[] = "HTTP/1.1 200 OK\r\ncontent-length: 26\r\ncontent-type: application/json\r\n"
                              "\r\n{\"offset\":0,\"partition\":0}";
static char CONSUME[512]; /* built in main: 100 bytes of body, like the benchmark's messages */
static const char CREATED[] = "HTTP/1.1 201 Created\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";
static const char OTHER[] = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";

/* One complete request at the front of c->buf: its length, or 0 if more bytes are needed. */
static size_t complete(struct conn *c, const char **reply, size_t *reply_len) {
  char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
  if (!end) return 0;
  size_t head = (size_t)(end - c->buf) + 4, body = 0;
  for (char *p = c->buf; p < end; p++) {
    if ((p == c->buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) body = strtoul(p + 15, 0, 10);
  }
  if (c->len < head + body) return 0;
  if (strncmp(c->buf, "POST /produce", 13) == 0) { *reply = PRODUCE; *reply_len = sizeof PRODUCE - 1; }
  else if (strncmp(c->buf, "GET /consume", 12) == 0) { *reply = CONSUME; *reply_len = strlen(CONSUME); }
  else if (strncmp(c->buf, "PUT /topics/", 12) == 0) { *reply = CREATED; *reply_len = sizeof CREATED - 1; }
  else { *reply = OTHER; *reply_len = sizeof OTHER - 1; }
  return head + body;
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 17800;
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1024)) { perror("listen"); return 1; }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[256];
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  char body[101];
  memset(body, 'x', 100);
  body[100] = 0;
  snprintf(CONSUME, sizeof CONSUME,
           "HTTP/1.1 200 OK\r\ncontent-length: 100\r\ncontent-type: application/octet-stream\r\n"
           "receipt-handle: 0:0:0:1\r\npartition: 0\r\noffset: 0\r\n\r\n%s", body);
  char out[BUF];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == ls) {
        int c;
        while ((c = accept4(ls, 0, 0, SOCK_NONBLOCK)) >= 0) {
          if (c >= MAXFD) { close(c); continue; }
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[c] = calloc(1, sizeof(struct conn));
          struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      struct conn *c = conns[fd];
      ssize_t got = recv(fd, c->buf + c->len, BUF - c->len, 0);
      if (got <= 0) {
        if (got < 0 && errno == EAGAIN) continue;
        close(fd); free(c); conns[fd] = 0; continue;
      }
      c->len += (size_t)got;
      size_t out_len = 0, used;
      const char *reply; size_t reply_len;
      while ((used = complete(c, &reply, &reply_len)) > 0) {
        memcpy(out + out_len, reply, reply_len);
        out_len += reply_len;
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
      }
      if (out_len) send(fd, out, out_len, 0);
      if (c->len == BUF) { close(fd); free(c); conns[fd] = 0; }
    }
  }
}
