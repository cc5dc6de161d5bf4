import HeraldPorts
import XCTest
import HeraldCore
import HeraldCrypto
import HeraldStores
import HeraldTestSupport
@testable import HeraldGateway
@testable import HeraldTransport

/// A connection's socket in memory, standing in for lws's raw socket: the
/// test is the client (it sends bytes, reads what the connection wrote) and
/// the network (how many bytes the socket takes). As lws does, it reads
/// what the client sent in pieces, only while reading is on; tells the
/// connection it may write once the socket has room again; and closes after
/// the current callback (`service`).
final class MemorySocket: ConnectionSocket {
    private unowned let loop: ServiceLoop
    /// What lws would keep in the connection's per-session pointer.
    var connection: RawConnection?
    /// Sent by the client, not yet read by the connection.
    private var pending: [UInt8] = []
    /// Written by the connection, not yet read by the client.
    private(set) var unread: [UInt8] = []
    /// How many more bytes the socket takes before the client reads.
    var room = Int.max
    private(set) var wantsWritable = false
    private(set) var reading = true
    /// Our side shut (`shutdownWrite`): the client read the end of the stream.
    private(set) var writeShut = false
    private var closing = false
    private(set) var isClosed = false
    private(set) var upgrade: (handshake: [UInt8], origin: String?, early: [UInt8])?
    /// Reads lws makes at most.
    static let readSize = 4096

    init(loop: ServiceLoop) { self.loop = loop }

    func write(_ bytes: UnsafeRawBufferPointer) -> SocketWrite {
        XCTAssertFalse(writeShut || isClosed, "written after shutdown or close")
        guard room > 0 else { return .full }
        let n = min(room, bytes.count)
        unread += bytes[..<n]
        if room != .max { room -= n }
        return .wrote(n)
    }

    func wantWritable() { wantsWritable = true }
    func setReading(_ on: Bool) { reading = on }
    func shutdownWrite() { writeShut = true }
    func close() { closing = true }

    func upgrade(handshake: [UInt8], origin: String?, early: [UInt8]) {
        upgrade = (handshake, origin, early)
        connection = nil
    }

    /// The client sends `bytes`; the connection reads them as lws would.
    func clientSends(_ bytes: [UInt8]) {
        pending += bytes
        service()
    }

    /// The client reads `bytes` more (all by default) of what was written,
    /// making as much room in the socket.
    @discardableResult func clientReads(_ bytes: Int = .max) -> [UInt8] {
        let n = min(bytes, unread.count)
        let got = Array(unread[..<n])
        unread.removeFirst(n)
        if room != .max { room += n }
        service()
        return got
    }

    /// What lws does between callbacks: closes what asked to close, reads
    /// while reading is on, calls `writable` when the socket has room.
    func service() {
        while let c = connection, !isClosed {
            if closing {
                isClosed = true
                connection = nil
                loop.closed(c)
            } else if reading, !pending.isEmpty {
                let n = min(Self.readSize, pending.count)
                let piece = Array(pending[..<n])
                pending.removeFirst(n)
                piece.withUnsafeBytes { c.receive($0) }
            } else if wantsWritable, room > 0 {
                wantsWritable = false
                _ = c.writable()
            } else {
                return
            }
        }
    }

    var unreadInput: Int { pending.count }
}

/// One gateway in-process behind a real (never started) service loop, its
/// engine run on the test's thread, a manual clock. Connections are
/// adopted on memory sockets.
final class TransportHarness {
    static let app = AppConfig(id: "app.test", serverKey: "sk", tokenSecret: "ts")
    let clock = ManualClock()
    let store = MemoryStore()
    let gateway: Gateway
    let loop: ServiceLoop

    /// `cap`: the process's connection cap; `limits`: changes to the default limits.
    init(cap: Int = 100, limits change: (inout GatewayLimits) -> Void = { _ in }) {
        var limits = GatewayLimits()
        change(&limits)
        gateway = try! Gateway(config: GatewayConfig(apps: [Self.app], limits: limits), store: store, clock: clock)
        loop = ServiceLoop(index: 0, listenFd: -1, gateway: gateway, admission: Admission(cap: cap), eventLoop: .poll, tls: nil)
        loop.shard = gateway.makeShards([loop])[0]
        loop.shard.thread.claim()
    }

    func connect() -> MemorySocket {
        let s = MemorySocket(loop: loop)
        s.connection = loop.adopt(s)
        return s
    }

    /// Runs engine batches, reads and the loop's inbox until none has anything left.
    func settle(_ sockets: MemorySocket...) {
        repeat {
            for e in gateway.partitions { e.runQueued() }
            gateway.reads.runQueued()
            for s in sockets { s.service() }
        } while loop.drainInbox() || gateway.metrics.engineQueued > 0
        for s in sockets { s.service() }
    }

    /// Time passes; the loop's tick runs (timers, deadlines).
    func advance(millis: Int64, _ sockets: MemorySocket...) {
        clock.advance(millis: millis)
        loop.runTick()
        for s in sockets { s.service() }
    }

    func token(_ user: String) -> String {
        let now = clock.now() / 1000
        let s = Self.app.signingSecret
        return DeviceToken.sign(DeviceClaims(app: Self.app.id, user: user, device: nil, issuedAt: now, expiresAt: now + 3600),
                                secret: s.secret, kid: s.kid)
    }

    var slowConsumerDrops: Int { gateway.metrics.drops.withLock { $0[Metrics.DropReason.allCases.firstIndex(of: .slowConsumer)!] } }

    /// Whether the store holds `user`'s notification `anid`.
    func stored(_ user: String, _ anid: String) -> Bool {
        (try! store.notification(UserKey(app: Self.app.id, user: user), appNotificationId: anid)) != nil
    }
}

/// A request's bytes, with `Host` unless `host` is false.
func request(_ method: String, _ target: String, version: String = "HTTP/1.1", headers: [(String, String)] = [],
             body: [UInt8] = [], host: Bool = true) -> [UInt8] {
    var head = "\(method) \(target) \(version)\r\n"
    if host { head += "Host: herald.test\r\n" }
    for (k, v) in headers { head += "\(k): \(v)\r\n" }
    if !body.isEmpty, !headers.contains(where: { $0.0.lowercased() == "content-length" }) { head += "Content-Length: \(body.count)\r\n" }
    return Array((head + "\r\n").utf8) + body
}

func publish(_ user: String, _ anid: String, headers: [(String, String)] = []) -> [UInt8] {
    request("POST", "/v1/apps/\(TransportHarness.app.id)/users/\(user)/notifications",
            headers: [("Authorization", "Bearer sk")] + headers,
            body: Array(#"{"appNotificationId":"\#(anid)","payload":{"body":"hi"}}"#.utf8))
}

let healthz = request("GET", "/healthz")

/// One answer as the client reads it.
struct Answer {
    var status: Int
    /// Field names lower-cased.
    var headers: [String: String]
    var body: [UInt8]
    var json: JSONObject? { try? JSONParser.parse(body).objectValue }
    var closes: Bool { headers["connection"] == "close" }
}

/// Parses the answers in `bytes`: bodies by Content-Length, chunked, or
/// (neither) to the end; none after a 1xx or 204, or for `head` answers.
/// Fails the test on a partial answer.
func answers(_ bytes: [UInt8], head: Bool = false, file: StaticString = #filePath, line: UInt = #line) -> [Answer] {
    let (out, partial) = parseAnswers(bytes, head: head)
    if partial { XCTFail("a partial answer after \(out.count): \(String(decoding: bytes, as: UTF8.self))", file: file, line: line) }
    return out
}

/// The whole answers in `bytes`, and whether a partial one follows them.
func parseAnswers(_ bytes: [UInt8], head: Bool = false) -> ([Answer], partial: Bool) {
    var out: [Answer] = []
    var i = 0
    let crlf2: [UInt8] = Array("\r\n\r\n".utf8)
    while i < bytes.count {
        guard bytes.count - i >= 4, let end = (i...bytes.count - 4).first(where: { Array(bytes[$0..<$0 + 4]) == crlf2 }) else {
            return (out, true)
        }
        let lines = String(decoding: bytes[i..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let status = Int(lines[0].split(separator: " ")[1])!
        var headers: [String: String] = [:]
        for l in lines.dropFirst() {
            let kv = l.split(separator: ":", maxSplits: 1)
            headers[kv[0].lowercased()] = kv[1].trimmingCharacters(in: .whitespaces)
        }
        i = end + 4
        var body: [UInt8] = []
        if status < 200 || status == 204 || head {
        } else if let n = headers["content-length"].flatMap({ Int($0) }) {
            guard i + n <= bytes.count else { return (out, true) }
            body = Array(bytes[i..<i + n])
            i += n
        } else if headers["transfer-encoding"] == "chunked" {
            while true {
                guard let eol = (i..<max(i, bytes.count - 1)).first(where: { bytes[$0] == 13 && bytes[$0 + 1] == 10 }),
                      let size = Int(String(decoding: bytes[i..<eol], as: UTF8.self), radix: 16),
                      eol + 2 + size + 2 <= bytes.count else { return (out, true) }
                i = eol + 2 + size + 2
                if size == 0 { break }
                body += bytes[eol + 2..<eol + 2 + size]
            }
        } else {
            body = Array(bytes[i...])
            i = bytes.count
        }
        out.append(Answer(status: status, headers: headers, body: body))
    }
    return (out, false)
}
