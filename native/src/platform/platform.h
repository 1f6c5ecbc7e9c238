/* What differs between operating systems, behind one small interface. The core, the team
 * engine and the transports call these instead of system calls of their own. A profile
 * implements all of it and is chosen at build time (setup.py, $POOLTENSOR_NATIVE): linux.c
 * (PT_PLATFORM_LINUX: memfd, futex, eventfd, pidfd, cross-memory attach) or posix.c
 * (PT_PLATFORM_POSIX: only what macOS also has: shm_open, pthreads, pipes, kill(pid, 0) or
 * kqueue, no cross-memory attach). Nothing here knows of contexts, peers or transports.
 *
 * A call that fails with PT_ERR_SYS has recorded errno (pt__sys) for pt_last_errno().
 */
#ifndef PT_PLATFORM_H
#define PT_PLATFORM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "pt.h"

/* ---- errors (errno.c, shared by every profile) ---- */

/* Record errno for pt_last_errno() and return PT_ERR_SYS: right after a failed system call. */
pt_status_t pt__sys(void);

/* ---- shareable segments ---- */

/* Shared memory that a same-host peer maps knowing only our pid and the handle. Linux: a
 * memfd or a nameless file of a huge-page tmpfs (no name in /dev/shm, so nothing outlives the
 * processes that hold it, even after SIGKILL), which peers open through /proc/<pid>/fd/<handle>. */
typedef struct {
    void *base;
    size_t len;
    int handle;
} pt_plat_segment_t;

/* len bytes (a multiple of the page size), mapped read-write; large ones 2 MiB-aligned and
 * advised for transparent huge pages. */
pt_status_t pt_plat_segment_create(size_t len, pt_plat_segment_t *out);
void pt_plat_segment_destroy(pt_plat_segment_t *seg);
/* What segments are made of in this process: "memfd" or "tmpfs" (Linux: a private tmpfs
 * mounted huge=within_size, where shmem huge pages are off), "shm_open" (posix). Decided
 * once, at the first segment or the first call. */
const char *pt_plat_segment_kind(void);
/* Map len bytes of segment `handle` of process pid, placed as pt_plat_segment_create places
 * ours. write: read-write or fail; else read-write where the system lets us, read-only
 * otherwise (*writable_out, may be NULL, says which). PT_ERR_PEER_LOST when the process or
 * the segment is gone. */
pt_status_t pt_plat_segment_map(int32_t pid, int32_t handle, size_t len, int write,
                                void **base_out, int *writable_out);
void pt_plat_segment_unmap(void *base, size_t len);
/* Every peer that will map segment `handle` of process pid has mapped it: what names it can
 * go (posix: the shm_open name; linux: nothing, a memfd has none). The mappings stay. */
void pt_plat_segment_seal(int32_t pid, int32_t handle);

/* ---- wait and wake on a 32-bit word (Linux: a futex) ---- */

/* Sleep while *addr == expected, for at most timeout seconds (< 0: no limit). shared: the word
 * may be in memory shared with other processes. It may return early (a wake-up, a signal, or
 * a profile that cannot sleep on an address naps instead): callers check again. */
void pt_plat_wait(_Atomic uint32_t *addr, uint32_t expected, double timeout, int shared);
/* Wake everyone sleeping in pt_plat_wait on addr. */
void pt_plat_wake(_Atomic uint32_t *addr, int shared);

/* ---- wake-up descriptors: how a thread blocked in poll() is woken ---- */

/* rfd polls readable (POLLIN) once signalled, until drained. Linux: one eventfd (rfd == wfd);
 * a pipe where there is none. */
typedef struct {
    int rfd, wfd;
} pt_plat_wakefd_t;

#define PT_PLAT_WAKEFD_CLOSED ((pt_plat_wakefd_t){-1, -1})

pt_status_t pt_plat_wakefd_open(pt_plat_wakefd_t *out);
/* Make rfd readable (nothing when closed); never blocks. */
void pt_plat_wakefd_signal(const pt_plat_wakefd_t *w);
/* Take every signal so far: rfd is not readable until the next one. */
void pt_plat_wakefd_drain(const pt_plat_wakefd_t *w);
/* Close it (nothing when closed); it is closed after. */
void pt_plat_wakefd_close(pt_plat_wakefd_t *w);

/* ---- a socket's sleeper, whose interest another thread can switch off ---- */

/* A descriptor a thread sleeps on until socket fd has input, whose interest another thread can
 * switch off and on again without waking the sleeper (Linux: an epoll with a one-shot
 * interest), or -1 where the system has none: then the sleeper is the socket's only reader.
 * Created with the interest off. */
int pt_plat_sleeper_open(int fd);
/* Interest in fd's input on (the next input, or input already there, wakes the sleeper once)
 * or off (nothing wakes it but the socket's end). */
void pt_plat_sleeper_arm(int sp, int fd, int on);
/* Sleep until what the interest watches comes, or timeout_ms. */
void pt_plat_sleeper_wait(int sp, int timeout_ms);
void pt_plat_sleeper_close(int sp);        /* nothing for -1 */
/* An alarm in sleeper sp (-1 where the sleeper has none, or sp is -1): a descriptor that
 * pt_plat_sleeper_alarm sets to wake the sleeper later, for a reader that switched the
 * interest off and means to come back soon but may not. Closed with pt_plat_sleeper_close. */
int pt_plat_sleeper_timer(int sp);
/* Wake the sleeper of timer t in `seconds` (again: from now on; 0: not at all). */
void pt_plat_sleeper_alarm(int t, double seconds);
/* Whether timer t rang since the last call (and forget that it did). */
int pt_plat_sleeper_rang(int t);

/* ---- peer death ---- */

/* A descriptor that polls readable once process pid has exited (Linux: a pidfd), or -1 where
 * the system offers none: then ask pt_plat_peer_gone now and then. */
int pt_plat_peer_watch(int32_t pid);
void pt_plat_peer_unwatch(int fd);       /* nothing for -1 */
/* 1 when process pid is known to be gone. */
int pt_plat_peer_gone(int32_t pid);

/* ---- copying from and to a peer's private memory (Linux: cross-memory attach) ---- */

/* len bytes between buf and address addr in process pid, the kernel serving it without the
 * peer taking part. PT_ERR_PEER_LOST when the process is gone, PT_ERR_BOUNDS when the copy
 * stops short, PT_ERR_UNSUPPORTED where the system has no such copy. */
pt_status_t pt_plat_copy_from_peer(int32_t pid, void *dst, uint64_t addr, size_t len);
pt_status_t pt_plat_copy_to_peer(int32_t pid, uint64_t addr, const void *src, size_t len);

/* ---- random bytes ---- */

/* len bytes from the system's random source. */
pt_status_t pt_plat_random(void *buf, size_t len);

/* ---- the profile, housekeeping ---- */

/* "linux" or "posix". */
const char *pt_plat_name(void);
/* Remove what processes of ours that died left behind (posix: shm_open names of dead pids);
 * nothing where nothing can be left (linux). Called when a context is made and destroyed. */
void pt_plat_reap(void);

/* ---- small portable wrappers of calls that differ ---- */

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

/* A stream socket, close-on-exec, non-blocking if asked. */
int pt_plat_socket(int family, int nonblock);
/* accept(), the new descriptor close-on-exec. */
int pt_plat_accept(int lfd);
/* Keepalive probes after idle seconds, every intvl seconds, cnt of them (what the system has). */
void pt_plat_keepalive(int fd, int idle, int intvl, int cnt);
/* Data written to fd that stays unacknowledged for `seconds` ends the connection (the system
 * resets it): where the system has such a timeout (Linux TCP_USER_TIMEOUT); else nothing. */
void pt_plat_unacked_timeout(int fd, double seconds);
/* A send that never raises SIGPIPE: flags for send()/sendmsg(), and pt_plat_socket has set
 * SO_NOSIGPIPE where there is no MSG_NOSIGNAL (macOS). */
#ifdef MSG_NOSIGNAL
#define PT_PLAT_MSG_NOSIGNAL MSG_NOSIGNAL
#else
#define PT_PLAT_MSG_NOSIGNAL 0
#endif
/* poll() event for "the peer closed its end" where the system has one (Linux POLLRDHUP); 0
 * elsewhere (the hang-up is then seen by the next read). */
#if defined(PT_PLATFORM_LINUX) && defined(POLLRDHUP)
#define PT_PLAT_POLLRDHUP POLLRDHUP
#else
#define PT_PLAT_POLLRDHUP 0
#endif
/* A reader-writer lock whose writers do not starve behind a stream of readers where the
 * system lets us ask (glibc); the default kind elsewhere. */
void pt_plat_rwlock_init(pthread_rwlock_t *l);
/* Both profiles (platform/map.c): map segment `fd` of `len` bytes shared, large ones 2 MiB
 * aligned and advised for huge pages; MAP_FAILED on failure, as mmap. */
void *pt__plat_map_shared(int fd, size_t len, int prot);
/* Both profiles: the end of mapping a peer's segment from its opened `fd` (closed here),
 * writable in this process when prot_write; *writable_out (if given) = writable. */
pt_status_t pt__plat_map_peer(int fd, size_t len, int prot_write, int writable, void **base_out,
                              int *writable_out);
/* Zero secret bytes in a way the compiler does not drop. */
void pt_plat_secure_zero(void *p, size_t len);

#endif
