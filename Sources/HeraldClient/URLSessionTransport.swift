import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

/// HTTP requests and WebSockets through `URLSession`: the transport for
/// Apple platforms, and for HTTP on Linux too (FoundationNetworking). Where
/// URLSession has no WebSockets (Linux: its libcurl was built without them)
/// a connection reports its upgrade refused, so the client syncs by
/// long-poll (`Options.fallback`). Redirects are not followed.
public final class URLSessionTransport: HeraldTransport {
    private let session: URLSession
    private let delegate = SessionDelegate()

    public init(configuration: URLSessionConfiguration = .ephemeral) {
        session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil)
    }

    deinit { session.finishTasksAndInvalidate() }

    public func send(_ request: HTTPRequest, to endpoint: Endpoint) async throws -> HTTPResponse {
        var r = URLRequest(url: endpoint.url(secureScheme: "https", plainScheme: "http", path: endpoint.basePath + request.target),
                           timeoutInterval: Double(request.timeout.components.seconds) + 1)
        r.httpMethod = request.method
        for (name, value) in request.headers { r.setValue(value, forHTTPHeaderField: name) }
        if !request.body.isEmpty || request.method != "GET" { r.httpBody = Data(request.body) }
        do {
            let (data, response) = try await session.data(for: r)
            guard let http = response as? HTTPURLResponse else { throw HeraldClientError.unreachable("the answer was not HTTP") }
            return HTTPResponse(status: http.statusCode, body: [UInt8](data))
        } catch let error as URLError where error.code == .cancelled {
            throw CancellationError()
        } catch let error as HeraldClientError {
            throw error
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            throw HeraldClientError.unreachable(error.localizedDescription)
        }
    }

    public func open(_ endpoint: Endpoint) -> any WebSocketChannel {
        let url = endpoint.url(secureScheme: "wss", plainScheme: "ws", path: endpoint.webSocketPath)
        let channel = URLSessionChannel(task: session.webSocketTask(with: url))
        delegate.channels.withLock { $0[channel.task.taskIdentifier] = channel }
        channel.task.resume()
        return channel
    }
}

extension Endpoint {
    func url(secureScheme: String, plainScheme: String, path: String) -> URL {
        let host = self.host.contains(":") ? "[\(self.host)]" : self.host
        return URL(string: "\(secure ? secureScheme : plainScheme)://\(host):\(port)\(path)")!
    }
}

/// The session's callbacks: no redirects, and each WebSocket's opening and end.
private final class SessionDelegate: NSObject, URLSessionWebSocketDelegate, Sendable {
    let channels = Mutex<[Int: URLSessionChannel]>([:])

    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void) {
        completionHandler(nil)
    }

    func urlSession(_ session: URLSession, webSocketTask: URLSessionWebSocketTask, didOpenWithProtocol protocol: String?) {
        channels.withLock { $0[webSocketTask.taskIdentifier] }?.opened()
    }

    /// The task's completion, which follows, reports the end with this code.
    func urlSession(_ session: URLSession, webSocketTask: URLSessionWebSocketTask,
                    didCloseWith closeCode: URLSessionWebSocketTask.CloseCode, reason: Data?) {}

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        channels.withLock { $0.removeValue(forKey: task.taskIdentifier) }?.ended(error)
    }
}

/// One WebSocket through a `URLSessionWebSocketTask`.
final class URLSessionChannel: WebSocketChannel, @unchecked Sendable {  // `task` is thread-safe; `open` behind a Mutex
    let events: AsyncStream<SocketEvent>
    let task: URLSessionWebSocketTask
    private let continuation: AsyncStream<SocketEvent>.Continuation
    /// nil before the upgrade, true while open, false once ended.
    private let open = Mutex<Bool?>(nil)

    init(task: URLSessionWebSocketTask) {
        self.task = task
        // The gateway's frames are at most 1 MiB (PROTOCOL.md 6.2); leave room.
        task.maximumMessageSize = 2 << 20
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
    }

    func send(_ text: String) {
        guard open.withLock({ $0 == true }) else { return }
        task.send(.string(text)) { _ in }  // a failed send ends the task, which reports it
    }

    func close() { task.cancel(with: .normalClosure, reason: nil) }

    func opened() {
        open.withLock { $0 = true }
        continuation.yield(.open)
        receive()
    }

    private func receive() {
        task.receive { [self] result in
            switch result {
            case .success(.string(let text)):
                continuation.yield(.text(text))
                receive()
            case .success:
                receive()  // binary frames are not part of the protocol: skipped
            case .failure:
                break  // the task's completion reports the end
            }
        }
    }

    /// Reports the end once: a refused upgrade when it never opened.
    func ended(_ error: (any Error)?) {
        let wasOpen = open.withLock { was in defer { was = false }; return was }
        guard wasOpen != false else { return }
        if wasOpen == nil {
            let status = (task.response as? HTTPURLResponse)?.statusCode
            continuation.yield(.refused(status: status, reason: error.map { $0.localizedDescription } ?? "the upgrade was refused"))
        } else {
            let code = task.closeCode == .invalid ? 1006 : task.closeCode.rawValue
            let reason = task.closeReason.map { String(decoding: $0, as: UTF8.self) } ?? error?.localizedDescription ?? ""
            continuation.yield(.closed(code: code, reason: reason))
        }
        continuation.finish()
    }
}
