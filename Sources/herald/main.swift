import Foundation
import HeraldCore
import HeraldGateway
import HeraldStores
import HeraldTransport

/// The one place the version is written.
let version = "0.10.0"

let usage = """
usage: herald serve [--host 127.0.0.1] [--port 8080] [--config herald.json] [--store sqlite:herald.db | memory]
                    [--app ID --server-key KEY --token-secret SECRET] [--demo] [--threads N] [--web-root DIR]
                    [--durability full|normal|off] [--event-loop libev|poll] [--log-format text|json]
       herald token --app ID --user USER [--ttl 3600] [--device ID] [--config herald.json | --token-secret SECRET]
       herald --version
"""

func fail(_ m: String) -> Never {
    FileHandle.standardError.write("herald: \(m)\n".data(using: .utf8)!)
    exit(2)
}

func serve(_ args: ArraySlice<String>) throws(UsageError) -> Never {
    let f = try Flags(args, valued: ["host", "port", "config", "store", "bus", "app", "server-key", "token-secret",
                                     "threads", "web-root", "durability", "event-loop", "log-format"], switches: ["demo"])
    if let l = f["log-format"] {
        guard let format = Log.Format(rawValue: l) else { throw UsageError("--log-format must be text or json") }
        Log.use(format)
    }
    var file = ConfigFile()
    if let path = f["config"] { file = try ConfigFile(path: path) }
    var apps = file.apps
    let single = [f["app"], f["server-key"], f["token-secret"]]
    if single.contains(where: { $0 != nil }) {
        guard let id = single[0], let key = single[1], let secret = single[2] else {
            throw UsageError("--app, --server-key and --token-secret go together")
        }
        apps.removeAll { $0.id == id }
        apps.append(try ConfigFile.app(id: id, serverKeys: [key], tokenSecrets: [TokenSecret(secret: secret)]))
    }
    let demo = f.switches.contains("demo")
    guard !apps.isEmpty || demo else { throw UsageError("no app configured: give --config, --app ... or --demo") }
    let host = f["host"] ?? file.host ?? "127.0.0.1"
    guard host.split(separator: ".").count == 4, inet_addr(host) != INADDR_NONE || host == "255.255.255.255" else {
        throw UsageError("--host must be an IPv4 address such as 127.0.0.1")
    }
    let port = try f.int("port", in: 0...65535) ?? file.port ?? 8080
    let threads = try f.int("threads", in: 1...64) ?? ProcessInfo.processInfo.activeProcessorCount
    var eventLoop = EventLoopKind.default
    if let e = f["event-loop"] {
        guard let k = EventLoopKind(rawValue: e) else { throw UsageError("--event-loop must be libev or poll") }
        eventLoop = k
    }
    if let bus = f["bus"] ?? file.bus { throw UsageError("--bus \(bus): the Redis bus is not available in this build") }
    let store = try openStore(f["store"] ?? file.store ?? "sqlite:herald.db", durability: f["durability"])

    var config = GatewayConfig(apps: apps, demo: demo, limits: file.limits)
    config.webRoot = f["web-root"] ?? findWebRoot()
    if demo { Log.warning("demo mode: app 'demo' is open to anyone (POST /v1/demo/token, server key 'demo-server-key'); never use it in production") }
    let gateway: Gateway
    do { gateway = try Gateway(config: config, store: store) } catch {
        FileHandle.standardError.write("herald: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
    let server = Server(gateway: gateway, host: host, port: port, threads: threads, eventLoop: eventLoop)
    // SIGTERM and SIGINT stay blocked in every thread (the mask is inherited)
    // and are taken with sigwait below, so one that arrives the instant we
    // start is kept pending instead of lost.
    var stopSignals = sigset_t()
    sigemptyset(&stopSignals)
    sigaddset(&stopSignals, SIGTERM)
    sigaddset(&stopSignals, SIGINT)
    pthread_sigmask(SIG_BLOCK, &stopSignals, nil)
    signal(SIGPIPE, SIG_IGN)
    do { try server.start() } catch {
        FileHandle.standardError.write("herald: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
    Log.info("herald \(threads) \(eventLoop.rawValue) loop(s), store \(storeName(store)), apps: \(config.allApps.map(\.id).joined(separator: ", "))")
    FileHandle.standardOutput.write("listening on http://\(host):\(server.port)\n".data(using: .utf8)!)
    var received: Int32 = 0
    sigwait(&stopSignals, &received)
    Log.info("shutting down")
    server.shutdown()
    Log.info("stopped")
    // Everything is committed and every connection closed. _exit skips the
    // atexit handlers: OpenSSL's cleanup there raced the thread-exit
    // destructors of loop and engine threads that used libcrypto (a crash,
    // or an ASan double-free, at the very end of a clean shutdown).
    fflush(nil)
    _exit(0)
}

func openStore(_ spec: String, durability: String?) throws(UsageError) -> NotificationStore {
    if spec == "memory" {
        guard durability == nil else { throw UsageError("--durability applies to the sqlite store only") }
        return MemoryStore()
    }
    if spec.hasPrefix("sqlite:") {
        let path = String(spec.dropFirst("sqlite:".count))
        guard !path.isEmpty else { throw UsageError("--store sqlite: needs a file path") }
        return try openSQLite(path: path, durability: durability)
    }
    if spec.hasPrefix("postgres://") || spec.hasPrefix("postgresql://") {
        throw UsageError("--store \(spec.prefix(11))...: the PostgreSQL store is not available in this build")
    }
    throw UsageError("--store must be memory, sqlite:PATH or postgres://...")
}

func storeName(_ s: NotificationStore) -> String { String(describing: type(of: s)) }

/// The demo page: `web-demo/` in the working directory or beside the package.
func findWebRoot() -> String? {
    let exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    let candidates = [FileManager.default.currentDirectoryPath + "/web-demo"]
        + (1...4).map { n in (0..<n).reduce(exe) { u, _ in u.deletingLastPathComponent() }.appendingPathComponent("web-demo").path }
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

let argv = CommandLine.arguments
do throws(UsageError) {
    switch argv.count > 1 ? argv[1] : "" {
    case "serve": try serve(argv.dropFirst(2))
    case "token": try token(argv.dropFirst(2))
    case "--version", "version":
        print("herald \(version) (libwebsockets \(libwebsocketsVersion))")
        exit(0)
    case "-h", "--help", "help":
        print(usage)
        exit(0)
    case "": fail("a command is required (serve or token)")
    default: fail("unknown command '\(argv[1])'")
    }
} catch {
    fail(error.message)
}
