import Foundation
import HeraldCurl
import XCTest

/// A test case with its own tls_test_server.py (HTTP/2 by ALPN, or
/// HTTP/1.1, a CA of its own) on loopback, so that each test's connection
/// count starts at zero, and the events the server reports on HTTP/2
/// connections (PINGs, closes) to wait for.
class TLSServerTestCase: XCTestCase {
    private var server: Process!
    private var serverInput: Pipe!
    var port = 0
    /// The same server offering only HTTP/1.1 by ALPN.
    var http1Port = 0
    var ca = "", otherCa = ""
    /// Shut down at the end of the test.
    var clients: [any HTTPClient] = []
    private let events = LockedBox<[[String: Any]]>([])
    private let eventCame = DispatchSemaphore(value: 0)
    private var eventsRead = 0

    override func setUpWithError() throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("tls_test_server.py")
        server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        server.arguments = ["python3", script.path]
        let out = Pipe()
        // Its stdin closing ends the server too, should this process die first.
        serverInput = Pipe()
        server.standardOutput = out
        server.standardInput = serverInput
        try server.run()
        let info = try XCTUnwrap(try? JSONSerialization.jsonObject(with: Self.line(out.fileHandleForReading)) as? [String: Any],
                                 "the server's first line (python3 needs h2 and cryptography)")
        port = try XCTUnwrap(info["port"] as? Int)
        http1Port = try XCTUnwrap(info["http1Port"] as? Int)
        ca = try XCTUnwrap(info["ca"] as? String)
        otherCa = try XCTUnwrap(info["otherCa"] as? String)
        // Read on, so that the server never blocks on a full pipe.
        Thread { [events, eventCame] in
            while let line = try? Self.line(out.fileHandleForReading), !line.isEmpty {
                guard let e = try? JSONSerialization.jsonObject(with: line) as? [String: Any] else { continue }
                events.update { $0.append(e) }
                eventCame.signal()
            }
        }.start()
    }

    override func tearDown() {
        for c in clients { c.shutdown() }
        clients = []
        server.terminate()
        server.waitUntilExit()
        super.tearDown()
    }

    private static func line(_ f: FileHandle) throws -> Data {
        var line = Data()
        while let b = try f.read(upToCount: 1), !b.isEmpty, b != Data("\n".utf8) { line.append(b) }
        return line
    }

    // MARK: Helpers

    /// The server's next event of `kind` (those before it are passed over), or nil after `timeout`.
    func nextEvent(_ kind: String, timeout: Duration = .seconds(30)) -> [String: Any]? {
        let end = ContinuousClock.now + timeout
        while true {
            let all = events.get()
            while eventsRead < all.count {
                defer { eventsRead += 1 }
                if all[eventsRead]["event"] as? String == kind { return all[eventsRead] }
            }
            let left = end - .now
            guard left > .zero, eventCame.wait(timeout: .now() + left / .seconds(1)) == .success else { return nil }
        }
    }

    func request(_ path: String, method: String = "POST", headers: [(String, String)] = [("x-test", "1")],
                 body: String = #"{"a":1}"#, timeout: Duration = .seconds(10), scheme: String = "https") -> CurlRequest {
        CurlRequest(method: method, url: "\(scheme)://127.0.0.1:\(port)\(path)", headers: headers, body: Array(body.utf8), timeout: timeout)
    }

    struct NoAnswer: Error {}

    /// Sends and waits for the completion.
    func send(_ c: any HTTPClient, _ r: CurlRequest) throws -> Result<CurlResponse, CurlFailure> {
        try sendAll(c, [r])[0]
    }

    /// Sends all at once and waits for every completion; results in the requests' order.
    func sendAll(_ c: any HTTPClient, _ rs: [CurlRequest]) throws -> [Result<CurlResponse, CurlFailure>] {
        let done = DispatchGroup()
        let results = LockedBox<[Int: Result<CurlResponse, CurlFailure>]>([:])
        for (i, r) in rs.enumerated() {
            done.enter()
            c.send(r) { result in results.update { $0[i] = result }; done.leave() }
        }
        guard done.wait(timeout: .now() + 30) == .success else { throw NoAnswer() }
        return rs.indices.map { results.get()[$0]! }
    }

    func json(_ r: Result<CurlResponse, CurlFailure>) throws -> [String: Any] {
        try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(r.get().body)) as? [String: Any])
    }

    func connectionsAccepted(_ c: any HTTPClient) throws -> Int? {
        try json(send(c, request("/stats")))["connections"] as? Int
    }
}

extension Result where Failure == CurlFailure {
    var failure: CurlFailure? { if case .failure(let f) = self { return f }; return nil }
}

/// The calling thread's name, as the OS has it.
func currentThreadName() -> String {
    let comm = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
    return comm.trimmingCharacters(in: .newlines)
}

/// A value the test's thread and the client's share.
final class LockedBox<T>: @unchecked Sendable {  // every access holds `lock`
    private let lock = NSLock()
    private var value: T
    init(_ v: T) { value = v }
    func get() -> T { lock.withLock { value } }
    func set(_ v: T) { lock.withLock { value = v } }
    func update(_ f: (inout T) -> Void) { lock.withLock { f(&value) } }
}
