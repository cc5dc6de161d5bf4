// herald-client-bench: what a HeraldClient costs a device (docs/BENCHMARKS.md,
// "HeraldClient"). Run by bench/client.sh against a release gateway:
//
//   herald-client-bench --url URL --app APP --server-key KEY [--count 1000] [--rounds 5] [--dir DIR]
//                       [--tls-url URL --ca PEM]
//
// 1. Memory per `count` cached notifications: one client, live on an empty
//    feed, then `count` notifications published to it (about 1 KB of payload
//    each), then `count` more with a mix (all 1 KB but 1 in 100 at 60 KiB);
//    the growth of the resident set (after malloc_trim) at each step, beside
//    the size of those notifications' wire JSON.
// 2. Resume: the client stopped, `count` changes published, the client
//    started again on its state file: the time from start() to live with all
//    of them applied, `rounds` times (the first round creates, the others
//    replace the same notifications).
// 3. An HTTP call: `counts()` 100 times, this process's CPU and the wall
//    time per call, over http and (with --tls-url, the same app on a
//    gateway with a certificate `--ca` trusts) over https.
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import HeraldClient
import HeraldClientLWS

struct Failure: Error, CustomStringConvertible { let description: String }

let args = Array(CommandLine.arguments.dropFirst())
func flag(_ name: String) -> String? { args.firstIndex(of: "--" + name).flatMap { $0 + 1 < args.count ? args[$0 + 1] : nil } }
guard let url = flag("url"), let app = flag("app"), let serverKey = flag("server-key") else {
    FileHandle.standardError.write(Data("usage: herald-client-bench --url URL --app APP --server-key KEY [--count 1000] [--rounds 5] [--dir DIR]\n".utf8))
    exit(2)
}
let count = Int(flag("count") ?? "") ?? 1000
let rounds = Int(flag("rounds") ?? "") ?? 5
let dir = flag("dir") ?? NSTemporaryDirectory()
let run = UUID().uuidString.prefix(8)

/// One server API call; answers the JSON object.
func call(_ method: String, _ path: String, _ body: [String: Any]) async throws -> [String: Any] {
    var request = URLRequest(url: URL(string: url + "/v1/apps/\(app)" + path)!)
    request.httpMethod = method
    request.setValue("Bearer \(serverKey)", forHTTPHeaderField: "Authorization")
    request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    request.httpBody = try JSONSerialization.data(withJSONObject: body)
    let (data, response) = try await URLSession.shared.data(for: request)
    guard let status = (response as? HTTPURLResponse)?.statusCode, (200..<300).contains(status),
          let o = try JSONSerialization.jsonObject(with: data) as? [String: Any]
    else { throw Failure(description: "\(method) \(path): \(String(decoding: data, as: UTF8.self).prefix(200))") }
    return o
}

/// A body of `bytes` characters, different per notification.
func body(_ i: Int, bytes: Int) -> String {
    String(repeating: "Lorem ipsum dolor sit amet, consectetur adipiscing elit \(i). ", count: bytes / 60 + 1).prefix(bytes).description
}

/// Publishes notifications `name-0` ... `name-(n-1)` (replacing those that exist); large(i): 60 KiB body.
func publish(user: String, name: String, _ n: Int, large: (Int) -> Bool = { _ in false }) async throws {
    for i in 0..<n {
        let payload: [String: Any] = ["title": "Build \(i) of \(name) finished", "body": body(i, bytes: large(i) ? 60 * 1024 : 900),
                                      "url": "https://ci.example.com/builds/\(i)", "kind": "ci"]
        _ = try await call("POST", "/users/\(user)/notifications", ["appNotificationId": "\(name)-\(i)", "payload": payload])
    }
}

func client(user: String, at gateway: String = url, caFile: String? = nil) async throws -> HeraldClient {
    let token = try await call("POST", "/tokens", ["userId": user, "ttlSeconds": 3600])["token"] as! String
    let options = HeraldClient.Options(url: gateway, deviceId: "bench", stateFile: "\(dir)/herald-client-bench-\(user).db")
    return try HeraldClient(options: options, transport: LWSTransport(caFile: caFile), token: { token })
}

/// This process's CPU time so far (user and system).
func cpuTime() -> Duration {
    var u = rusage()
    getrusage(RUSAGE_SELF.rawValue, &u)
    let micros = (Int64(u.ru_utime.tv_sec) + Int64(u.ru_stime.tv_sec)) * 1_000_000 + Int64(u.ru_utime.tv_usec) + Int64(u.ru_stime.tv_usec)
    return .microseconds(micros)
}

/// `counts()` 100 times after one warm-up: CPU and wall time per call.
func httpCost(_ name: String, at gateway: String, caFile: String? = nil) async throws {
    let c = try await client(user: "http-\(name)-\(run)", at: gateway, caFile: caFile)
    _ = try await c.counts()
    let (cpu0, wall0) = (cpuTime(), ContinuousClock.now)
    for _ in 0..<100 { _ = try await c.counts() }
    let (cpu, wall) = (cpuTime() - cpu0, ContinuousClock.now - wall0)
    print(String(format: "HTTP call (counts) over %@: %.2f ms of CPU, %.2f ms wall, each of 100", name, ms(cpu) / 100, ms(wall) / 100))
}

/// Reads the client's events (as an app would: an unread stream keeps them
/// all) until it is live holding `n` notifications.
func live(_ client: HeraldClient, holding n: Int, _ events: inout AsyncStream<HeraldClient.Event>.Iterator) async throws {
    if await client.isLive, await client.notifications.count == n { return }
    while let event = await events.next() {
        if case .problem(let p) = event { throw Failure(description: "client problem: \(p)") }
        if await client.isLive, await client.notifications.count == n { return }
    }
    throw Failure(description: "the event stream ended")
}

extension HeraldClient {
    var isLive: Bool { if case .live = connection { return true }; return false }
}

/// glibc's malloc_trim (malloc.h is not in the Glibc module): returns the
/// heap's free memory to the system, so RSS counts what is in use.
let mallocTrim = dlsym(dlopen(nil, RTLD_NOW), "malloc_trim").map { unsafeBitCast($0, to: (@convention(c) (Int) -> Int32).self) }

/// The resident set in bytes, after returning free memory.
func rss() -> Int {
    _ = mallocTrim?(0)
    let statm = (try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8)) ?? ""
    let pages = statm.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

func mib(_ bytes: Int) -> String { String(format: "%.2f MiB", Double(bytes) / 1_048_576) }
func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15 }

do {
    // Warm up what publishing allocates (URLSession), so it is not counted.
    try await publish(user: "warmup-\(run)", name: "w", 100)

    // 1. Memory.
    let m = try await client(user: "memory-\(run)")
    var mEvents = m.events.makeAsyncIterator()
    await m.start()
    try await live(m, holding: 0, &mEvents)
    let empty = rss()
    try await publish(user: "memory-\(run)", name: "small", count)
    try await live(m, holding: count, &mEvents)
    let small = rss()
    try await publish(user: "memory-\(run)", name: "mixed", count, large: { $0 % 100 == 99 })
    try await live(m, holding: 2 * count, &mEvents)
    let mixed = rss()
    let cached = await m.notifications
    func wire(_ batch: String) -> Int {
        cached.filter { $0.appNotificationId.hasPrefix(batch + "-") }.reduce(0) { $0 + $1.json.encodedString.utf8.count }
    }
    let file = (try? FileManager.default.attributesOfItem(atPath: "\(dir)/herald-client-bench-memory-\(run).db")[.size] as? Int) ?? 0
    await m.stop()
    print("memory, RSS growth per \(count) cached notifications:")
    print("  ~1 KB payloads:               \(mib(small - empty))  (their wire JSON: \(mib(wire("small"))))")
    print("  mix, 1 in 100 at 60 KiB:      \(mib(mixed - small))  (their wire JSON: \(mib(wire("mixed"))))")
    print("  whole process, live on an empty feed: \(mib(empty))")
    print("  state file with \(2 * count): \(mib(file)) (WAL not counted)")

    // 2. Resume.
    let user = "resume-\(run)"
    let r = try await client(user: user)
    var rEvents = r.events.makeAsyncIterator()
    await r.start()
    try await live(r, holding: 0, &rEvents)
    var times: [Double] = []
    for round in 1...rounds {
        await r.stop()
        try await publish(user: user, name: "missed", count)  // round 1 creates, later rounds replace
        let started = ContinuousClock.now
        await r.start()
        try await live(r, holding: count, &rEvents)
        times.append(ms(ContinuousClock.now - started))
        print(String(format: "resume of %d missed changes, round %d: %.1f ms", count, round, times.last!))
    }
    await r.stop()
    let sorted = times.sorted()
    print(String(format: "resume of %d missed changes: median %.1f ms, min %.1f, max %.1f over %d rounds",
                 count, sorted[sorted.count / 2], sorted.first!, sorted.last!, rounds))

    // 3. An HTTP call.
    try await httpCost("http", at: url)
    if let tls = flag("tls-url") { try await httpCost("https", at: tls, caFile: flag("ca")) }

    for f in ["memory", "resume", "http-http", "http-https"] {
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: "\(dir)/herald-client-bench-\(f)-\(run).db\(suffix)") }
    }
} catch {
    FileHandle.standardError.write(Data("herald-client-bench: \(error)\n".utf8))
    exit(1)
}
