import Foundation
import XCTest
@testable import HeraldCurl

/// CurlClient against a real TLS server on loopback (tls_test_server.py:
/// HTTP/2 by ALPN, or HTTP/1.1), with a CA of its own.
final class CurlClientTests: XCTestCase {
    private var server: Process!
    private var stdin: Pipe!
    private var port = 0
    private var ca = "", otherCa = ""
    private var clients: [CurlClient] = []

    override func setUpWithError() throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("tls_test_server.py")
        server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        server.arguments = ["python3", script.path]
        let out = Pipe()
        stdin = Pipe()
        server.standardOutput = out
        server.standardInput = stdin
        try server.run()
        var line = Data()
        while let b = try out.fileHandleForReading.read(upToCount: 1), !b.isEmpty, b != Data("\n".utf8) { line.append(b) }
        let info = try XCTUnwrap(try JSONSerialization.jsonObject(with: line) as? [String: Any], "the server's first line")
        port = try XCTUnwrap(info["port"] as? Int)
        ca = try XCTUnwrap(info["ca"] as? String)
        otherCa = try XCTUnwrap(info["otherCa"] as? String)
    }

    override func tearDown() {
        for c in clients { c.shutdown() }
        try? stdin.fileHandleForWriting.close()
        server.waitUntilExit()
        super.tearDown()
    }

    func client(http2: Bool = true, caFile: String? = nil, maxResponseBytes: Int = 64 * 1024) throws -> CurlClient {
        let c = try CurlClient(name: "test", caFile: caFile ?? ca, http2: http2, maxInFlight: 1000, maxResponseBytes: maxResponseBytes)
        clients.append(c)
        return c
    }

    func request(_ path: String, timeout: Duration = .seconds(10), scheme: String = "https") -> CurlRequest {
        CurlRequest(method: "POST", url: "\(scheme)://127.0.0.1:\(port)\(path)", headers: [("x-test", "1"), ("content-type", "application/json")],
                    body: Array("{\"a\":1}".utf8), timeout: timeout)
    }

    /// Sends and waits for the answer.
    func send(_ c: CurlClient, _ r: CurlRequest) -> Result<CurlResponse, CurlFailure> {
        let done = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(r) { result.set($0); done.signal() }
        done.wait()
        return result.get()!
    }

    func json(_ r: Result<CurlResponse, CurlFailure>) throws -> [String: Any] {
        let body = try r.get().body
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])
    }

    func testHTTP2WithHeadersAndBodyBothWays() throws {
        let r = send(try client(), request("/echo"))
        XCTAssertEqual(try r.get().status, 200)
        XCTAssertEqual(try r.get().httpVersion, 2)
        XCTAssertEqual(try r.get().headers["x-echo"], "yes")
        let echo = try json(r)
        XCTAssertEqual(echo["protocol"] as? String, "h2")
        XCTAssertEqual(echo["method"] as? String, "POST")
        XCTAssertEqual((echo["headers"] as? [String: String])?["x-test"], "1")
        XCTAssertNil((echo["headers"] as? [String: String])?["expect"])
        XCTAssertEqual(echo["bodyLength"] as? Int, 7)
    }

    func testManyRequestsShareOneConnection() throws {
        let c = try client()
        let done = DispatchGroup()
        let statuses = LockedBox<[Int]>([])
        for _ in 0..<100 {
            done.enter()
            c.send(request("/echo")) { r in
                statuses.update { $0.append((try? r.get().status) ?? -1) }
                done.leave()
            }
        }
        done.wait()
        XCTAssertEqual(statuses.get(), [Int](repeating: 200, count: 100))
        let stats = try json(send(c, request("/stats")))
        XCTAssertEqual(stats["connections"] as? Int, 1, "every stream on one connection")
    }

    func testAHungRequestTimesOutWhileOthersComplete() throws {
        let c = try client()
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(request("/hang", timeout: .seconds(2))) { result.set($0); hung.signal() }
        for _ in 0..<5 { XCTAssertEqual(try send(c, request("/echo")).get().status, 200) }
        hung.wait()
        XCTAssertEqual(result.get()?.failure, .timedOut)
    }

    func testOnlyHTTPSIsSentAndRedirectsAreNotFollowed() throws {
        let c = try client()
        XCTAssertEqual(send(c, request("/echo", scheme: "http")).failure, .refused("only https URLs are sent to"))
        let r = try send(c, request("/redirect")).get()
        XCTAssertEqual(r.status, 302, "the redirect is the answer")
        let stats = try json(send(c, request("/stats")))
        XCTAssertEqual(stats["connections"] as? Int, 1, "nothing connected for the http URL")
    }

    func testALongAnswerIsRefused() throws {
        XCTAssertEqual(send(try client(), request("/big")).failure, .tooLarge)
        XCTAssertEqual(try send(try client(maxResponseBytes: 1 << 20), request("/big")).get().body.count, 200 * 1024)
    }

    func testACertificateTheCADoesNotVouchForFails() throws {
        guard case .tls = send(try client(caFile: otherCa), request("/echo")).failure else {
            return XCTFail("expected a TLS failure")
        }
    }

    func testStatusAndRetryAfterPassThrough() throws {
        let r = try send(try client(), request("/status/429")).get()
        XCTAssertEqual(r.status, 429)
        XCTAssertEqual(r.headers["retry-after"], "7")
        XCTAssertEqual(String(decoding: r.body, as: UTF8.self), #"{"reason":"Scripted"}"#)
    }

    func testHTTP1WhenAsked() throws {
        let r = send(try client(http2: false), request("/echo"))
        XCTAssertEqual(try r.get().httpVersion, 1)
        XCTAssertEqual(try json(r)["protocol"] as? String, "http/1.1")
    }

    func testShutdownEndsWhatIsInFlight() throws {
        let c = try client()
        let ended = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(request("/hang", timeout: .seconds(60))) { result.set($0); ended.signal() }
        XCTAssertEqual(try send(c, request("/echo")).get().status, 200, "the hung request is in flight beside it")
        let t0 = Date()
        c.shutdown()
        ended.wait()
        XCTAssertLessThan(Date().timeIntervalSince(t0), 10)
        XCTAssertEqual(result.get()?.failure, .stopped)
        XCTAssertEqual(send(c, request("/echo")).failure, .stopped, "a stopped client sends nothing")
    }
}

extension Result where Failure == CurlFailure {
    var failure: CurlFailure? { if case .failure(let f) = self { return f }; return nil }
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
