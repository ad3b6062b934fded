// rendezvous.h -- hands rank 0's ncclUniqueId to the other ranks, without torch.
//
// Two ways, both documented in README.md:
//  - TCP (default): rank 0 listens on MASTER_PORT + 1 (or --rendezvous-port)
//    on every interface; the others connect to MASTER_ADDR and retry until it
//    is up.  Works across machines.
//  - a file (--rendezvous-dir DIR): rank 0 writes DIR/nccl-id-<job key>
//    atomically (temporary file + rename) and the others poll for it; rank 0
//    deletes it once every rank has joined.  Needs DIR on a filesystem all
//    ranks see.
//
// Both carry a job key (torchrun's run id, restart count and the world
// size), so a rank never joins another job's, or an earlier attempt's,
// communicator: a mismatch is an error that says so.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <stdexcept>
#include <string>

struct RendezvousConfig {
    int rank = 0;
    int world = 1;
    std::string master_addr;   // MASTER_ADDR (TCP)
    int port = 0;              // TCP port rank 0 listens on
    std::string dir;           // non-empty: use a file in this directory instead of TCP
    double timeout_s = 300;    // give up (with an error) after this long
    uint64_t job_key = 0;      // see job_key_from_env()
    std::string job_desc;      // human-readable form of the key, for messages
};

struct RendezvousError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// FNV-1a 64 of TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT and the world size.
uint64_t job_key_from_env(int world, std::string *desc);

// Rank 0 passes the id it created; the other ranks receive it.  Throws
// RendezvousError with a message that names the cause and the fix.
void share_unique_id(const RendezvousConfig &cfg, ncclUniqueId *id);

// For --rendezvous-dir: rank 0 removes the id file once all ranks have joined.
void rendezvous_cleanup(const RendezvousConfig &cfg);
