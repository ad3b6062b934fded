// rendezvous.cpp -- see rendezvous.h.
#include "rendezvous.h"

#include <arpa/inet.h>
#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <set>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

constexpr char kMagic[8] = {'J', 'M', 'L', 'P', 'R', 'D', 'V', '1'};
constexpr uint32_t kOk = 0, kWrongJob = 1;

double now_s()
{
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

// ---- wire format: fixed-size messages, integers big-endian ----------------

struct Hello {           // client -> rank 0
    char magic[8];
    uint32_t rank, world;
    uint64_t job_key;
};
struct Reply {           // rank 0 -> client
    char magic[8];
    uint32_t status;
    ncclUniqueId id;
};

uint64_t be64(uint64_t v) { return ((uint64_t)htonl((uint32_t)v) << 32) | htonl((uint32_t)(v >> 32)); }

// Reads or writes exactly n bytes; false on EOF, error or timeout (SO_RCVTIMEO/SO_SNDTIMEO).
bool io_all(int fd, void *buf, size_t n, bool writing)
{
    char *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

// The same for a regular file.
bool file_io_all(int fd, void *buf, size_t n, bool writing)
{
    char *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t r = writing ? write(fd, p, n) : read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

void set_io_timeout(int fd, double seconds)
{
    timeval tv{};
    tv.tv_sec = (time_t)seconds;
    tv.tv_usec = (suseconds_t)((seconds - (double)tv.tv_sec) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// ---- TCP --------------------------------------------------------------------

int listen_any(int port)
{
    // Dual-stack IPv6 socket if the host has IPv6, else IPv4.
    for (int family : {AF_INET6, AF_INET}) {
        int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        int rc;
        if (family == AF_INET6) {
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            sockaddr_in6 a{};
            a.sin6_family = AF_INET6;
            a.sin6_addr = in6addr_any;
            a.sin6_port = htons((uint16_t)port);
            rc = bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
        } else {
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_ANY);
            a.sin_port = htons((uint16_t)port);
            rc = bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
        }
        if (rc == 0 && listen(fd, 64) == 0)
            return fd;
        int err = errno;
        close(fd);
        if (err == EADDRINUSE)
            throw RendezvousError(fmt("rank 0 cannot listen on port %d: %s. Another program uses it; pass "
                                      "--rendezvous-port PORT with a free port (the same on every rank), or "
                                      "--rendezvous-dir DIR to exchange the NCCL id through a file",
                                      port, std::strerror(err)));
        if (family == AF_INET)
            throw RendezvousError(fmt("rank 0 cannot listen on port %d: %s", port, std::strerror(err)));
    }
    throw RendezvousError(fmt("rank 0 cannot create a TCP socket: %s", std::strerror(errno)));
}

void serve_id(const RendezvousConfig &cfg, const ncclUniqueId &id)
{
    int lfd = listen_any(cfg.port);
    std::set<uint32_t> served;
    const double deadline = now_s() + cfg.timeout_s;
    while ((int)served.size() < cfg.world - 1) {
        const double left = deadline - now_s();
        if (left <= 0) {
            std::string missing;
            for (int r = 1; r < cfg.world; r++)
                if (!served.count((uint32_t)r))
                    missing += (missing.empty() ? "" : ",") + std::to_string(r);
            close(lfd);
            throw RendezvousError(fmt("rank 0: ranks %s did not fetch the NCCL id from port %d within %g s "
                                      "(did they start? do they see MASTER_ADDR=%s?)",
                                      missing.c_str(), cfg.port, cfg.timeout_s, cfg.master_addr.c_str()));
        }
        pollfd pfd{lfd, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)std::min(left * 1000.0, 1000.0) + 1);
        if (pr <= 0)
            continue;
        int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        set_io_timeout(fd, 10);
        Hello h{};
        if (io_all(fd, &h, sizeof h, false) && std::memcmp(h.magic, kMagic, sizeof kMagic) == 0) {
            Reply rep{};
            std::memcpy(rep.magic, kMagic, sizeof kMagic);
            const uint32_t rank = ntohl(h.rank), world = ntohl(h.world);
            const bool same_job = be64(h.job_key) == cfg.job_key && (int)world == cfg.world && rank >= 1 &&
                                  (int)rank < cfg.world;
            rep.status = htonl(same_job ? kOk : kWrongJob);
            if (same_job)
                rep.id = id;
            if (io_all(fd, &rep, sizeof rep, true) && same_job)
                served.insert(rank);
            if (!same_job)
                std::fprintf(stderr,
                             "rendezvous: rank 0 refused a peer claiming rank %u of %u from another job "
                             "(job key %016llx, ours %016llx: %s)\n",
                             rank, world, (unsigned long long)be64(h.job_key), (unsigned long long)cfg.job_key,
                             cfg.job_desc.c_str());
        }
        // Anything else (a port scanner, a half-open connection) is ignored.
        close(fd);
    }
    close(lfd);
}

void fetch_id(const RendezvousConfig &cfg, ncclUniqueId *id)
{
    const double deadline = now_s() + cfg.timeout_s;
    std::string last_error = "no attempt";
    const std::string port = std::to_string(cfg.port);
    for (;;) {
        addrinfo hints{}, *res = nullptr;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(cfg.master_addr.c_str(), port.c_str(), &hints, &res);
        if (gai != 0) {
            last_error = fmt("cannot resolve MASTER_ADDR=%s: %s", cfg.master_addr.c_str(), gai_strerror(gai));
        } else {
            for (addrinfo *ai = res; ai; ai = ai->ai_next) {
                int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
                if (fd < 0)
                    continue;
                set_io_timeout(fd, 10);
                if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
                    last_error = fmt("connect: %s", std::strerror(errno));
                    close(fd);
                    continue;
                }
                Hello h{};
                std::memcpy(h.magic, kMagic, sizeof kMagic);
                h.rank = htonl((uint32_t)cfg.rank);
                h.world = htonl((uint32_t)cfg.world);
                h.job_key = be64(cfg.job_key);
                Reply rep{};
                const bool ok = io_all(fd, &h, sizeof h, true) && io_all(fd, &rep, sizeof rep, false);
                close(fd);
                if (!ok) {
                    last_error = "the connection closed before the id arrived";
                    continue;
                }
                if (std::memcmp(rep.magic, kMagic, sizeof kMagic) != 0) {
                    freeaddrinfo(res);
                    throw RendezvousError(fmt("%s:%d is not this program's rendezvous (another service "
                                              "uses the port?); pass --rendezvous-port or --rendezvous-dir",
                                              cfg.master_addr.c_str(), cfg.port));
                }
                if (ntohl(rep.status) != kOk) {
                    freeaddrinfo(res);
                    throw RendezvousError(fmt("the rendezvous at %s:%d belongs to another job or "
                                              "attempt (ours: %s); check that every rank has the same "
                                              "WORLD_SIZE and torchrun environment",
                                              cfg.master_addr.c_str(), cfg.port, cfg.job_desc.c_str()));
                }
                *id = rep.id;
                freeaddrinfo(res);
                return;
            }
            freeaddrinfo(res);
        }
        if (now_s() > deadline)
            throw RendezvousError(fmt("no NCCL id from rank 0 at %s:%d after %g s (last error: %s); "
                                      "is rank 0 running?",
                                      cfg.master_addr.c_str(), cfg.port, cfg.timeout_s,
                                      last_error.c_str()));
        sleep_s(0.05);
    }
}

// ---- file -------------------------------------------------------------------

struct IdFile {
    char magic[8];
    uint64_t job_key;
    ncclUniqueId id;
};

std::string id_path(const RendezvousConfig &cfg)
{
    char name[64];
    std::snprintf(name, sizeof name, "/nccl-id-%016llx", (unsigned long long)cfg.job_key);
    return cfg.dir + name;
}

void write_id_file(const RendezvousConfig &cfg, const ncclUniqueId &id)
{
    if (mkdir(cfg.dir.c_str(), 0700) != 0 && errno != EEXIST)
        throw RendezvousError(fmt("rank 0 cannot create --rendezvous-dir %s: %s", cfg.dir.c_str(),
                                  std::strerror(errno)));
    const std::string path = id_path(cfg);
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    IdFile f{};
    std::memcpy(f.magic, kMagic, sizeof kMagic);
    f.job_key = cfg.job_key;
    f.id = id;
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        throw RendezvousError(fmt("rank 0 cannot write %s: %s (is --rendezvous-dir writable?)", tmp.c_str(),
                                  std::strerror(errno)));
    const bool ok = file_io_all(fd, &f, sizeof f, true) && fsync(fd) == 0;
    const int err = errno;
    close(fd);
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = ok ? errno : err;
        unlink(tmp.c_str());
        throw RendezvousError(fmt("rank 0 cannot write %s: %s", path.c_str(), std::strerror(e)));
    }
}

}  // namespace

uint64_t job_key_from_env(int world, std::string *desc)
{
    const char *run = std::getenv("TORCHELASTIC_RUN_ID");
    const char *restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    std::string d = fmt("run id %s, restart %s, world size %d", run ? run : "(unset)", restart ? restart : "(unset)",
                        world);
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv1a(h, d.data(), d.size());
    if (desc)
        *desc = d;
    return h;
}

void share_unique_id(const RendezvousConfig &cfg, ncclUniqueId *id)
{
    if (cfg.world <= 1)
        return;
    if (cfg.dir.empty()) {
        if (cfg.rank == 0)
            serve_id(cfg, *id);
        else
            fetch_id(cfg, id);
        return;
    }
    if (cfg.rank == 0) {
        write_id_file(cfg, *id);
        return;
    }
    const std::string path = id_path(cfg);
    const double deadline = now_s() + cfg.timeout_s;
    for (;;) {
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            IdFile f{};
            const bool ok = file_io_all(fd, &f, sizeof f, false);
            close(fd);
            if (!ok || std::memcmp(f.magic, kMagic, sizeof kMagic) != 0 || f.job_key != cfg.job_key)
                throw RendezvousError(fmt("%s is not a valid NCCL id file of this job (%s); remove it "
                                          "or use a fresh --rendezvous-dir",
                                          path.c_str(), cfg.job_desc.c_str()));
            *id = f.id;
            return;
        }
        if (now_s() > deadline)
            throw RendezvousError(fmt("%s did not appear within %g s; is rank 0 running, with the "
                                      "same --rendezvous-dir on a filesystem this rank sees?",
                                      path.c_str(), cfg.timeout_s));
        sleep_s(0.02);
    }
}

void rendezvous_cleanup(const RendezvousConfig &cfg)
{
    if (cfg.world > 1 && cfg.rank == 0 && !cfg.dir.empty())
        unlink(id_path(cfg).c_str());
}
