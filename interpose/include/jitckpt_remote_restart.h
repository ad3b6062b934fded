/* jitckpt_remote_restart.h -- the calls of the proxy-restart protocol
 * (transparent mode, milestone 2b; proxy_server/README.md, "Device pointers"
 * and "The call log, replay and recovery").
 *
 * Hand-written on both sides (interpose/remote/restart.c, the worker;
 * proxy_server/src/restore.c and devmem.c, the proxy), marshalled with the
 * ordinary primitives: by-value fields in the order listed, host bytes
 * through the arena (rc_put_in/rc_put_out).  Ids below JITCKPT_RFN_PARAM_SIZES,
 * far above the generated enum remote_fn. */
#ifndef JITCKPT_REMOTE_RESTART_H
#define JITCKPT_REMOTE_RESTART_H

#define JITCKPT_RFN_RST_INFO 0xffe0u      /* -> u32 fixed (1: allocations at fixed addresses), u64 base, u64 size */
#define JITCKPT_RFN_RST_SYNC 0xffe1u      /* cudaDeviceSynchronize on every device, current device kept */
#define JITCKPT_RFN_RST_ALLOC_AT 0xffe2u  /* u64 addr, u64 size, i32 device */
#define JITCKPT_RFN_RST_STREAM 0xffe3u    /* u64 vid, u32 flags, i32 priority, i32 device */
#define JITCKPT_RFN_RST_EVENT 0xffe4u     /* u64 vid, u32 flags, i32 device */
#define JITCKPT_RFN_RST_COMM 0xffe5u      /* u64 vid, i32 nranks (1), i32 rank, i32 device */
#define JITCKPT_RFN_RST_EXPECT 0xffe6u    /* i32 kind, u64 vid: the next handle of that kind gets this id */
#define JITCKPT_RFN_RST_READ 0xffe7u      /* u64 addr, u64 n, host_out: n bytes of device memory */
#define JITCKPT_RFN_RST_WRITE 0xffe8u     /* u64 addr, u64 n, host_in: n bytes into device memory */
#define JITCKPT_RFN_RST_SYM_READ 0xffe9u  /* u64 symbol key, u64 n, host_out */
#define JITCKPT_RFN_RST_SYM_WRITE 0xffeau /* u64 symbol key, u64 n, host_in */
#define JITCKPT_RFN_RST_DEVICE 0xffebu    /* i32 device (-1: only ask) -> i32 the current device */
/* Recovery (milestone 4): */
#define JITCKPT_RFN_RST_UNIQUE_ID 0xffecu /* -> 128 bytes: ncclGetUniqueId */
#define JITCKPT_RFN_RST_COMM_REBUILD 0xffedu /* u64 vid, i32 nranks, i32 rank, i32 device, 128 bytes id */
#define JITCKPT_RFN_RST_XFER 0xffeeu      /* u64 comm vid, i32 peer, i32 send (1) or receive (0), u64 addr, u64 n */
#define JITCKPT_RFN_RST_CLEAR 0xffefu     /* -> i32 first error left by the replayed calls; clears errors and the watch */
#define JITCKPT_RFN_RST_HEALTH 0xffdfu    /* -> i32 device state after synchronising (0: healthy), u64 done_marker */

/* The device proxy's reserved range for device memory, per rank:
 * JITCKPT_PROXY_VA_BASE (default 16 TiB + (LOCAL_RANK % 32) TiB) and
 * JITCKPT_PROXY_VA_SIZE (default 1 TiB). */
#define JITCKPT_PROXY_VA_BASE_ENV "JITCKPT_PROXY_VA_BASE"
#define JITCKPT_PROXY_VA_SIZE_ENV "JITCKPT_PROXY_VA_SIZE"
#define JITCKPT_PROXY_VA_DEFAULT_BASE (16ull << 40)
#define JITCKPT_PROXY_VA_DEFAULT_SIZE (1ull << 40)

#endif
