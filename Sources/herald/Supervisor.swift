import CLibWebSockets
import Foundation
import HeraldGateway
import HeraldPorts
import HeraldTransport

/// `herald serve --workers N`: N worker processes of this same binary behind
/// one listening socket, which this process (the supervisor) binds before
/// any worker starts, so a port in use still fails at once with exit 2.
///
/// Processes, not fork: the supervisor is a multithreaded Swift process, so
/// each worker is a fresh exec of /proc/self/exe (posix_spawn), which also
/// means a worker restarted after an upgrade on disk still runs the
/// supervisor's version. A worker inherits the listening descriptor (named
/// by `HERALD_WORKER_LISTEN_FD`) and accepts from it like its own loops do
/// from their duplicates; the kernel hands each connection to whichever
/// worker's loop takes it first. No SO_REUSEPORT: nothing outside this
/// supervisor can join the port (shim.h, herald_listen), and `--port 0`
/// still means one port for all.
///
/// A worker is a full node of the cluster: its own store connections, its
/// own bus connections and node id, its own presence lease. Workers share
/// live changes and history only through PostgreSQL and Redis, hence
/// `--workers 2` or more needs both.
///
/// Ownership: everything here runs on the main thread, in one poll over a
/// signalfd (SIGTERM, SIGINT, SIGHUP, SIGCHLD, blocked in every thread) and
/// each worker's stdout pipe, on which the worker says `listening on ...`
/// once it accepts. The supervisor prints its own one line when every
/// worker has said it.
final class Supervisor {
    /// The internal environment of a worker (not for operators).
    enum Env {
        static let index = "HERALD_WORKER"
        static let listenFd = "HERALD_WORKER_LISTEN_FD"
        static let supervisor = "HERALD_WORKER_SUPERVISOR"
        /// The supervisor's store and bus, which win over a config file a
        /// restarted worker reads again: every worker stays on one store.
        static let store = "HERALD_WORKER_STORE"
        static let bus = "HERALD_WORKER_BUS"
        /// Where workers leave their metrics for each other (WorkerMetrics).
        static let metrics = "HERALD_WORKER_METRICS"
    }

    struct Worker {
        var pid: pid_t = 0
        /// Read end of the worker's stdout, -1 once it ended.
        var pipe: Int32 = -1
        var output: [UInt8] = []
        var ready = false
        var spawnedAt = 0.0
        /// When a dead worker is to be started again (nil: not dead).
        var restartAt: Double?
        /// The wait before the next restart: 0.5 s, doubling to 30 s while
        /// workers die within 10 s of starting.
        var backoff = 0.5
    }

    let arguments: [String]
    let environment: [String: String]
    /// The workers' metrics files (WorkerMetrics), removed at exit (by the
    /// last worker when the supervisor was killed).
    let metricsFolder: String?
    let listening: ListeningSocket
    let url: String
    private var workers: [Worker]
    private var signalFd: Int32 = -1
    private var workerMask = sigset_t()
    private var announced = false
    static let startDeadline = 60.0
    static let stopDeadline = 9.5

    /// `arguments`: the worker's command line after the executable
    /// (`serve ...` without `--workers`).
    init(count: Int, arguments: [String], listening: ListeningSocket, url: String, store: String, bus: String) {
        self.arguments = arguments
        self.listening = listening
        self.url = url
        var env = ProcessInfo.processInfo.environment
        env[Env.supervisor] = String(getpid())
        env[Env.store] = store
        env[Env.bus] = bus
        var folder = Array((NSTemporaryDirectory() as NSString).appendingPathComponent("herald-metrics.XXXXXX").utf8CString)
        if mkdtemp(&folder) != nil {
            metricsFolder = String(decoding: folder.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            env[Env.metrics] = metricsFolder
        } else {
            metricsFolder = nil
            env[Env.metrics] = nil
            Log.warning("supervisor: cannot make a folder for the workers' metrics (\(String(cString: strerror(errno)))); /metrics answers for one worker")
        }
        environment = env
        workers = Array(repeating: Worker(), count: count)
    }

    /// Runs until SIGTERM or SIGINT; exits the process.
    func run() -> Never {
        var mask = sigset_t()
        sigemptyset(&mask)
        for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&mask, s) }
        // Workers start with the same three blocked (they take them with
        // sigwait), but not SIGCHLD.
        workerMask = mask
        sigaddset(&mask, SIGCHLD)
        pthread_sigmask(SIG_BLOCK, &mask, nil)
        signalFd = herald_signalfd(&mask)
        guard signalFd >= 0 else {
            removeMetricsFolder()
            Self.die("supervisor: signalfd: \(String(cString: strerror(errno)))")
        }
        Log.info("supervisor: starting \(workers.count) workers on \(url)")
        let started = now()
        for i in workers.indices { spawn(i) }
        while true {
            var due = workers.compactMap(\.restartAt).min().map { $0 - now() }
            if !announced { due = min(due ?? .infinity, started + Self.startDeadline - now()) }
            wait(timeout: due)
            for s in takeSignals() {
                switch s {
                case SIGHUP:
                    Log.info("supervisor: SIGHUP, passed to every worker")
                    for w in workers where w.pid > 0 { kill(w.pid, SIGHUP) }
                case SIGCHLD: reap()
                default: stop()
                }
            }
            readPipes()
            if !announced {
                if workers.allSatisfy(\.ready) {
                    announced = true
                    Log.info("supervisor: \(workers.count) workers ready (pids \(workers.map { String($0.pid) }.joined(separator: ", ")))")
                    FileHandle.standardOutput.write("listening on \(url)\n".data(using: .utf8)!)
                } else if now() >= started + Self.startDeadline {
                    abandon("workers not ready within \(Int(Self.startDeadline)) s", status: 1)
                }
            }
            for i in workers.indices where workers[i].restartAt.map({ $0 <= now() }) == true { spawn(i) }
        }
    }

    // MARK: Workers

    private func spawn(_ i: Int) {
        workers[i].restartAt = nil
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { return retry(i, "cannot make a pipe: \(String(cString: strerror(errno)))") }
        // Only this thread starts processes, so none inherits them before this.
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        // The listening socket becomes descriptor 3 (4 if it is 3 already:
        // dup2 onto itself would keep close-on-exec), the pipe stdout.
        let target: Int32 = listening.fd == 3 ? 4 : 3
        var env = environment
        env[Env.index] = String(i + 1)
        env[Env.listenFd] = String(target)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_adddup2(&actions, listening.fd, target)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        posix_spawnattr_setsigmask(&attr, &workerMask)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK))
        let argv = ([CommandLine.arguments[0]] + arguments).map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv, envp)
        for p in argv + envp { free(p) }
        posix_spawn_file_actions_destroy(&actions)
        posix_spawnattr_destroy(&attr)
        close(fds[1])
        guard rc == 0 else {
            close(fds[0])
            return retry(i, "cannot start: \(String(cString: strerror(rc)))")
        }
        _ = fcntl(fds[0], F_SETFL, O_NONBLOCK)
        workers[i].pid = pid
        workers[i].pipe = fds[0]
        workers[i].output = []
        workers[i].ready = false
        workers[i].spawnedAt = now()
        if announced { Log.info("supervisor: worker \(i + 1) started again (pid \(pid))") }
    }

    /// A worker that could not start, or died: before every worker was ready
    /// that ends the supervisor; after, it is started again with backoff.
    private func retry(_ i: Int, _ why: String) {
        guard announced else { abandon("worker \(i + 1) \(why)", status: 1) }
        let w = workers[i]
        let delay = now() - w.spawnedAt >= 10 ? 0.5 : w.backoff
        workers[i].backoff = min(30, delay * 2)
        workers[i].restartAt = now() + delay
        Log.error("supervisor: worker \(i + 1)\(w.pid > 0 ? " (pid \(w.pid))" : "") \(why); starting it again in \(delay) s")
        workers[i].pid = 0
    }

    private func reap() {
        while true {
            var status: Int32 = 0
            let pid = waitpid(-1, &status, WNOHANG)
            guard pid > 0 else { return }
            guard let i = workers.firstIndex(where: { $0.pid == pid }) else { continue }
            if workers[i].pipe >= 0 { close(workers[i].pipe); workers[i].pipe = -1 }
            let why = Self.describe(status)
            // Before every worker is up, a worker's own usage error (exit 2)
            // is the supervisor's too.
            if !announced { abandon("worker \(i + 1) (pid \(pid)) \(why) before it was ready", status: Self.exitCode(status) == 2 ? 2 : 1) }
            retry(i, why)
        }
    }

    /// Reads what workers wrote on stdout: the one line each says when it
    /// accepts. Anything else is dropped (stdout carries only the
    /// supervisor's line).
    private func readPipes() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        for i in workers.indices where workers[i].pipe >= 0 {
            while true {
                let n = read(workers[i].pipe, &buffer, buffer.count)
                if n > 0 {
                    if !workers[i].ready {
                        workers[i].output += buffer[0..<n]
                        if String(decoding: workers[i].output, as: UTF8.self).contains("listening on ") { workers[i].ready = true }
                    }
                    continue
                }
                if n == 0 { close(workers[i].pipe); workers[i].pipe = -1 }
                break
            }
        }
    }

    // MARK: Stopping

    /// SIGTERM to every worker (each drains its connections: SPEC section 6),
    /// then SIGKILL to any still running after 9.5 s. Exit 0 when all ended
    /// by themselves with status 0.
    private func stop() -> Never {
        Log.info("supervisor: shutting down \(workers.filter { $0.pid > 0 }.count) workers")
        for w in workers where w.pid > 0 { kill(w.pid, SIGTERM) }
        let clean = collect(until: now() + Self.stopDeadline)
        close(listening.fd)
        removeMetricsFolder()
        Log.info(clean ? "stopped" : "stopped (not every worker ended cleanly)")
        fflush(nil)
        _exit(clean ? 0 : 1)
    }

    /// Ends every worker while a start is failing, then the supervisor.
    private func abandon(_ why: String, status: Int32) -> Never {
        Log.error("supervisor: \(why); stopping the others")
        for w in workers where w.pid > 0 { kill(w.pid, SIGTERM) }
        _ = collect(until: now() + Self.stopDeadline)
        removeMetricsFolder()
        fflush(nil)
        _exit(status)
    }

    private func removeMetricsFolder() {
        if let metricsFolder { try? FileManager.default.removeItem(atPath: metricsFolder) }
    }

    /// Waits for every worker to exit, killing those left at `deadline`.
    /// Whether each exited with status 0.
    private func collect(until deadline: Double) -> Bool {
        var clean = true
        while workers.contains(where: { $0.pid > 0 }) {
            let left = deadline - now()
            if left <= 0 {
                for i in workers.indices where workers[i].pid > 0 {
                    Log.error("supervisor: worker \(i + 1) (pid \(workers[i].pid)) still running after \(Self.stopDeadline) s; killing it")
                    kill(workers[i].pid, SIGKILL)
                    var status: Int32 = 0
                    waitpid(workers[i].pid, &status, 0)
                    workers[i].pid = 0
                }
                return false
            }
            wait(timeout: left)
            _ = takeSignals()  // a second SIGTERM changes nothing
            readPipes()  // else a pipe at its end keeps poll from waiting
            while true {
                var status: Int32 = 0
                let pid = waitpid(-1, &status, WNOHANG)
                guard pid > 0 else { break }
                guard let i = workers.firstIndex(where: { $0.pid == pid }) else { continue }
                if status != 0 {
                    clean = false
                    Log.error("supervisor: worker \(i + 1) (pid \(pid)) \(Self.describe(status)) while stopping")
                }
                workers[i].pid = 0
            }
        }
        return clean
    }

    // MARK: Waiting

    private func wait(timeout: Double?) {
        var fds = [pollfd(fd: signalFd, events: Int16(POLLIN), revents: 0)]
        for w in workers where w.pipe >= 0 { fds.append(pollfd(fd: w.pipe, events: Int16(POLLIN), revents: 0)) }
        let ms = timeout.map { Int32(max(0, min(60_000, ($0 * 1000).rounded(.up)))) } ?? -1
        _ = poll(&fds, nfds_t(fds.count), ms)
    }

    private func takeSignals() -> [Int32] {
        var got: [Int32] = []
        while true {
            let s = herald_read_signal(signalFd)
            guard s > 0 else { return got }
            got.append(s)
        }
    }

    private func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

    static func exitCode(_ status: Int32) -> Int32? { status & 0x7f == 0 ? (status >> 8) & 0xff : nil }

    static func describe(_ status: Int32) -> String {
        if let code = exitCode(status) { return "exited with status \(code)" }
        let signal = status & 0x7f
        return "was killed by signal \(signal) (\(String(cString: strsignal(signal))))"
    }

    static func die(_ m: String) -> Never {
        Log.error(m)
        exit(1)
    }
}

/// What a worker process learns from its supervisor (Supervisor.Env).
struct WorkerRole {
    let index: Int
    let listening: ListeningSocket
    let store: String
    let bus: String
    /// Where the workers leave their metrics (nil: /metrics answers for this worker only).
    let metricsFolder: String?

    /// The role in this process's environment, nil when it is no worker.
    /// Asks for SIGTERM when the supervisor dies.
    static func inherited() throws(UsageError) -> WorkerRole? {
        let env = ProcessInfo.processInfo.environment
        guard let fdText = env[Supervisor.Env.listenFd] else { return nil }
        guard let fd = Int32(fdText), let index = Int(env[Supervisor.Env.index] ?? ""),
              let parent = Int32(env[Supervisor.Env.supervisor] ?? ""),
              let store = env[Supervisor.Env.store], let bus = env[Supervisor.Env.bus] else {
            throw UsageError("incomplete worker environment (\(Supervisor.Env.listenFd) is set by herald serve --workers only)")
        }
        guard herald_die_with_parent(parent) != 0 else {
            FileHandle.standardError.write("herald: worker \(index): the supervisor (pid \(parent)) is gone\n".data(using: .utf8)!)
            exit(1)
        }
        do {
            return WorkerRole(index: index, listening: try ListeningSocket(inherited: fd), store: store, bus: bus,
                              metricsFolder: env[Supervisor.Env.metrics])
        } catch {
            throw UsageError("worker \(index): \(error)")
        }
    }
}
