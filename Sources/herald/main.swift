import Foundation
import HeraldClient
import HeraldClientLWS
import HeraldCore
import HeraldCrypto
import HeraldGateway
import HeraldPorts
import HeraldPush
import HeraldRedis
import HeraldStores
import HeraldTransport

/// The one place the version is written.
let version = "0.10.0"

let usage = """
usage: herald serve [--host 127.0.0.1] [--port 8080] [--config herald.json]
                    [--store sqlite:herald.db | memory | postgres://USER@HOST:PORT/DATABASE]
                    [--bus redis://[:PASSWORD@]HOST[:PORT][/DB]]
                    [--app ID --server-key KEY --token-secret SECRET [--allowed-origins ORIGIN,...]]
                    [--demo] [--threads N] [--partitions N] [--workers N] [--web-root DIR] [--admin-root DIR]
                    [--durability full|normal|off] [--event-loop libev|poll] [--log-format text|json]
                    [--tls-cert FILE --tls-key FILE]
       herald token --app ID --user USER [--ttl 3600] [--device ID] [--config herald.json | --token-secret SECRET]
       herald watch --url URL (--token TOKEN | --token-file FILE) --device ID [--platform web|ios|android|windows|other] [--tags A,B]
                    [--state herald-watch-DEVICE.db] [--ca-file FILE]
       herald --version
"""

func fail(_ m: String) -> Never {
    FileHandle.standardError.write("herald: \(m)\n".data(using: .utf8)!)
    exit(2)
}

func serve(_ args: ArraySlice<String>) throws(UsageError) -> Never {
    let f = try Flags(args, valued: ["host", "port", "config", "store", "bus", "app", "server-key", "token-secret", "allowed-origins",
                                     "threads", "partitions", "workers", "web-root", "admin-root", "durability", "event-loop", "log-format", "tls-cert", "tls-key"],
                      switches: ["demo"])
    if let l = f["log-format"] {
        guard let format = Log.Format(rawValue: l) else { throw UsageError("--log-format must be text or json") }
        Log.use(format)
    }
    // A worker of `--workers N` (Supervisor.swift): its supervisor's socket, store and bus.
    let worker = try WorkerRole.inherited()
    if let worker { Log.use(worker: worker.index) }
    // SIGTERM, SIGINT and SIGHUP stay blocked in every thread (the mask is
    // set before any thread starts, which inherit it) and are taken with
    // sigwait below, so one that arrives while we start is kept pending
    // instead of lost (or, for SIGHUP, instead of ending the process).
    var signals = sigset_t()
    sigemptyset(&signals)
    for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&signals, s) }
    pthread_sigmask(SIG_BLOCK, &signals, nil)
    signal(SIGPIPE, SIG_IGN)
    let settings = try Settings(f, worker: worker)
    let demo = f.switches.contains("demo")
    let workers = try f.int("workers", in: 1...64) ?? 1
    let threads = try f.int("threads", in: 1...64) ?? min(64, max(1, ProcessInfo.processInfo.activeProcessorCount / workers))
    var eventLoop = EventLoopKind.default
    if let e = f["event-loop"] {
        guard let k = EventLoopKind(rawValue: e) else { throw UsageError("--event-loop must be libev or poll") }
        eventLoop = k
    }
    let tls: TLSFiles?
    switch (settings.tlsCert, settings.tlsKey) {
    case (nil, nil): tls = nil
    case (.some(let cert), .some(let key)):
        tls = TLSFiles(certificate: cert, key: key)
        do { try tls?.validate() } catch { throw UsageError(error.description) }
    default: throw UsageError("--tls-cert and --tls-key go together")
    }
    if workers > 1 {
        guard isPostgres(settings.store), let busURL = settings.bus else {
            throw UsageError("--workers 2 or more needs --store postgres://... and --bus redis://...: workers share changes and history only through them")
        }
        _ = try openBus(busURL, store: settings.store)
        supervise(workers: workers, args: args, settings: settings, threads: f["threads"] == nil ? threads : nil, tls: tls != nil)
    }
    let bus = try settings.bus.map { url throws(UsageError) in try openBus(url, store: settings.store) }
    let stores = try openStores(settings.store, durability: f["durability"], partitions: try f.int("partitions", in: 1...64), threads: threads)

    var config = GatewayConfig(apps: settings.apps, demo: demo, limits: settings.limits)
    config.webRoot = f["web-root"] ?? findWebRoot("web-demo")
    config.adminRoot = f["admin-root"] ?? findWebRoot("web-admin")
    if let worker, let folder = worker.metricsFolder { config.workerMetrics = WorkerMetrics(folder: folder, index: worker.index) }
    if demo { Log.warning("demo mode: app 'demo' is open to anyone (POST /v1/demo/token, server key 'demo-server-key'); never use it in production") }
    // Key files were read when the config was; a client that cannot start
    // is as fatal. Made even with no app pushing: a reload may add push.
    let push: PushSenders
    do { push = try PushSenders(config.allApps) } catch { throw UsageError(error.description) }
    let gateway: Gateway
    do { gateway = try Gateway(config: config, partitions: stores, bus: bus, push: push) } catch {
        FileHandle.standardError.write("herald: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
    config.workerMetrics?.startWriting(gateway.metrics)
    let server = Server(gateway: gateway, host: settings.host, port: settings.port, threads: threads, eventLoop: eventLoop, tls: tls,
                        listening: worker?.listening)
    do { try server.start() } catch {
        FileHandle.standardError.write("herald: \(error)\n".data(using: .utf8)!)
        exit((error as? ServerError)?.addressInUse == true ? 2 : 1)
    }
    Log.info("herald \(threads) \(eventLoop.rawValue) loop(s), store \(storeName(stores[0]))\(stores.count > 1 ? " × \(stores.count) partitions" : "")\(bus.map { ", bus \($0.endpoint)" } ?? ""), apps: \(config.allApps.map(\.id).joined(separator: ", "))")
    FileHandle.standardOutput.write("listening on \(tls == nil ? "http" : "https")://\(settings.host):\(server.port)\n".data(using: .utf8)!)
    var running = settings
    var received: Int32 = 0
    while sigwait(&signals, &received) == 0, received == SIGHUP {
        reload(f, worker: worker, running: &running, gateway: gateway, server: server)
    }
    Log.info("shutting down")
    server.shutdown()
    config.workerMetrics?.remove()
    Log.info("stopped")
    // Everything is committed and every connection closed. _exit skips the
    // atexit handlers: OpenSSL's cleanup there raced the thread-exit
    // destructors of loop and engine threads that used libcrypto (a crash,
    // or an ASan double-free, at the very end of a clean shutdown).
    fflush(nil)
    _exit(0)
}

/// SIGHUP: reads the TLS certificate and the config file again, flags still
/// winning as at start, and puts its apps in force without dropping a
/// connection whose token still verifies. Files that do not read or validate
/// change nothing; settings only a restart applies are logged as such.
/// Everything a reload applies goes here.
func reload(_ f: Flags, worker: WorkerRole?, running: inout Settings, gateway: Gateway, server: Server) {
    if server.servesTLS {
        do {
            try server.reloadTLS()
            Log.info("reloaded the TLS certificate")
        } catch {
            Log.error("TLS reload refused, the running certificate stays: \(error)")
        }
    }
    guard let path = f["config"] else {
        if !server.servesTLS { Log.warning("SIGHUP: no --config file or TLS certificate to reload; nothing changed") }
        return
    }
    let next: Settings
    do { next = try Settings(f, worker: worker) } catch { return Log.error("config reload refused, nothing changed: \(error.message)") }
    let restartOnly = [("host", next.host != running.host), ("port", next.port != running.port),
                       ("store", next.store != running.store), ("bus", next.bus != running.bus), ("limits", next.limits != running.limits),
                       ("TLS certificate or key path", next.tlsCert != running.tlsCert || next.tlsKey != running.tlsKey)]
    for (name, changed) in restartOnly where changed {
        Log.warning("config reload: the new \(name) takes effect at the next restart")
    }
    let apps = describe(from: running.apps, to: next.apps)
    running.apps = next.apps
    gateway.reload(apps: next.apps) { ended in
        Log.info("config reloaded from \(path): \(apps); closed \(ended) connection(s) whose token no longer verifies")
    }
}

/// The apps and what a reload changed in them, by id (never a key or secret).
func describe(from old: [AppConfig], to new: [AppConfig]) -> String {
    let before = Dictionary(old.map { ($0.id, $0) }, uniquingKeysWith: { $1 })
    let ids = new.map(\.id)
    let changes = [("added", ids.filter { before[$0] == nil }),
                   ("removed", old.map(\.id).filter { !ids.contains($0) }),
                   ("changed", new.filter { a in before[a.id].map { $0 != a } ?? false }.map(\.id))]
        .filter { !$0.1.isEmpty }
        .map { "\($0.0) \($0.1.joined(separator: ", "))" }
    return "apps " + (ids.isEmpty ? "none" : ids.joined(separator: ", ")) + (changes.isEmpty ? "" : " (\(changes.joined(separator: "; ")))")
}

/// The stores of the gateway's partitions (one per service loop unless
/// `partitions` says): memory stores, each holding its users' feeds, or
/// connections to one PostgreSQL database; or SQLite files, one each, as a
/// SQLite file has one writer.
func openStores(_ spec: String, durability: String?, partitions: Int?, threads: Int) throws(UsageError) -> [NotificationStore] {
    if spec == "memory" {
        guard durability == nil else { throw UsageError("--durability applies to the sqlite store only") }
        return (0..<(partitions ?? threads)).map { _ in MemoryStore() }
    }
    if isPostgres(spec) {
        // A session each: unless asked, at most 8, so that a many-core node
        // does not take a database's connections (100 by default).
        let count = partitions ?? min(threads, 8)
        // Each caches its own users' feeds: the node's budget shared out.
        var stores: [NotificationStore] = []
        for _ in 0..<count { stores.append(try openPostgres(url: spec, durability: durability, share: count)) }
        return stores
    }
    guard spec.hasPrefix("sqlite:") else { throw UsageError("--store must be memory, sqlite:PATH or postgres://...") }
    let path = String(spec.dropFirst("sqlite:".count))
    guard !path.isEmpty else { throw UsageError("--store sqlite: needs a file path") }
    return try openSQLite(path: path, durability: durability, partitions: partitions)
}

/// `--workers N`, N ≥ 2: binds the port here (a port in use: exit 2 at
/// once), then runs N workers of this binary on it; never returns.
/// A worker's command line is this one without `--workers`, and with
/// `--threads` set to this machine's cores shared out when not given.
func supervise(workers: Int, args: ArraySlice<String>, settings: Settings, threads: Int?, tls: Bool) -> Never {
    let listening: ListeningSocket
    do { listening = try ListeningSocket(host: settings.host, port: settings.port) } catch {
        FileHandle.standardError.write("herald: \(error)\n".data(using: .utf8)!)
        exit(error.addressInUse ? 2 : 1)
    }
    var rest: [String] = ["serve"]
    var i = args.startIndex
    while i < args.endIndex {
        if args[i] == "--workers" { i += 2; continue }
        if !args[i].hasPrefix("--workers=") { rest.append(args[i]) }
        i += 1
    }
    if let threads { rest += ["--threads", String(threads)] }
    let url = "\(tls ? "https" : "http")://\(settings.host):\(listening.port)"
    Supervisor(count: workers, arguments: rest, listening: listening, url: url, store: settings.store, bus: settings.bus ?? "").run()
}

func isPostgres(_ store: String) -> Bool { store.hasPrefix("postgres://") || store.hasPrefix("postgresql://") }

/// `--bus redis://...`: only between nodes that share one store, so only
/// with PostgreSQL. Redis need not be up yet: the bus connects (and keeps
/// reconnecting) on its own.
func openBus(_ url: String, store: String) throws(UsageError) -> RedisBus {
    guard isPostgres(store) else {
        throw UsageError("--bus needs --store postgres://...: the nodes on a bus must share one store")
    }
    do { return RedisBus(try RedisEndpoint(url: url)) } catch { throw UsageError("--bus: \(error)") }
}

func storeName(_ s: NotificationStore) -> String { String(describing: type(of: s)) }

/// The demo page: `web-demo/` in the working directory or beside the package.
/// `folder` (with an `index.html`) in the working directory or up to four levels above the binary.
func findWebRoot(_ folder: String) -> String? {
    let exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    let candidates = [FileManager.default.currentDirectoryPath + "/" + folder]
        + (1...4).map { n in (0..<n).reduce(exe) { u, _ in u.deletingLastPathComponent() }.appendingPathComponent(folder).path }
    return candidates.first { FileManager.default.fileExists(atPath: $0 + "/index.html") }
}

func token(_ args: ArraySlice<String>) throws(UsageError) -> Never {
    let f = try Flags(args, valued: ["app", "user", "ttl", "device", "config", "token-secret"], switches: [])
    guard let app = f["app"] else { throw UsageError("token needs --app") }
    guard let user = f["user"] else { throw UsageError("token needs --user") }
    guard Identifiers.isUserId(user) else { throw UsageError("--user must be 1-128 characters of A-Z a-z 0-9 . _ @ : -") }
    if let d = f["device"], !Identifiers.isUserId(d) { throw UsageError("--device must be 1-128 characters of A-Z a-z 0-9 . _ @ : -") }
    let ttl = try f.int("ttl", in: 60...2_592_000) ?? 3600
    let secret: TokenSecret
    switch (f["config"], f["token-secret"]) {
    case (.some(let path), nil):
        guard let a = try ConfigFile(path: path).apps.first(where: { $0.id == app }) else {
            throw UsageError("config file \(path) has no app '\(app)'")
        }
        secret = a.signingSecret
    case (nil, .some(let s)):
        guard !s.isEmpty else { throw UsageError("--token-secret must not be empty") }
        secret = TokenSecret(secret: s)
    default: throw UsageError("token needs exactly one of --config and --token-secret")
    }
    let now = WallClock.now() / 1000
    let claims = DeviceClaims(app: app, user: user, device: f["device"], issuedAt: now, expiresAt: now + Int64(ttl))
    print(DeviceToken.sign(claims, secret: secret.secret, kid: secret.kid))
    exit(0)
}

/// The token in `path`, without surrounding whitespace; it must not be empty.
@Sendable func readTokenFile(_ path: String) throws -> String {
    let t = try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
    guard !t.isEmpty else { throw CocoaError(.fileReadCorruptFile) }
    return t
}

/// `herald watch`: a HeraldClient whose events are JSON lines on stdout,
/// driven by commands on stdin (Watch.swift).
func watch(_ args: ArraySlice<String>) throws(UsageError) -> Never {
    let f = try Flags(args, valued: ["url", "token", "token-file", "device", "platform", "tags", "state", "ca-file"], switches: [])
    guard let url = f["url"] else { throw UsageError("watch needs --url") }
    let token: HeraldClient.TokenProvider
    switch (f["token"], f["token-file"]) {
    case (let t?, nil):
        guard !t.isEmpty else { throw UsageError("watch needs --token") }
        token = { t }
    case (nil, let path?):
        // Read again whenever the client asks (at start, before the token
        // expires, after a refusal): whoever renews the file renews the
        // watch, and the token never shows in the process list.
        guard (try? readTokenFile(path)) != nil else { throw UsageError("cannot read a token from --token-file \(path)") }
        token = { try readTokenFile(path) }
    case (nil, nil): throw UsageError("watch needs --token or --token-file")
    case (.some, .some): throw UsageError("watch takes --token or --token-file, not both")
    }
    guard let device = f["device"] else { throw UsageError("watch needs --device") }
    guard Identifiers.isUserId(device) else { throw UsageError("--device must be 1-128 characters of A-Z a-z 0-9 . _ @ : -") }
    var options = HeraldClient.Options(url: url, deviceId: device, stateFile: f["state"] ?? "herald-watch-\(device).db")
    if let p = f["platform"] {
        guard let platform = Platform(rawValue: p) else { throw UsageError("--platform must be web, ios, android, windows or other") }
        options.platform = platform
    }
    if let t = f["tags"] {
        let tags = t.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        guard tags.allSatisfy(Identifiers.isTag) else { throw UsageError("--tags must be tags separated by commas") }
        options.tags = tags
    }
    if let ca = f["ca-file"], !FileManager.default.isReadableFile(atPath: ca) { throw UsageError("cannot read --ca-file \(ca)") }
    let client: HeraldClient
    do {
        client = try HeraldClient(options: options, transport: LWSTransport(caFile: f["ca-file"]), token: token)
    } catch .badURL {
        throw UsageError("--url must be http://, https://, ws:// or wss:// and a host")
    } catch {
        FileHandle.standardError.write("herald: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
    signal(SIGPIPE, SIG_IGN)
    Task { await Watch(client: client).run() }
    dispatchMain()
}

let argv = CommandLine.arguments
do throws(UsageError) {
    switch argv.count > 1 ? argv[1] : "" {
    case "serve": try serve(argv.dropFirst(2))
    case "token": try token(argv.dropFirst(2))
    case "watch": try watch(argv.dropFirst(2))
    case "--version", "version":
        print("herald \(version) (libwebsockets \(libwebsocketsVersion))")
        exit(0)
    case "-h", "--help", "help":
        print(usage)
        exit(0)
    case "": fail("a command is required (serve, token or watch)")
    default: fail("unknown command '\(argv[1])'")
    }
} catch {
    fail(error.message)
}
