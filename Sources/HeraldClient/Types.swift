import HeraldCore

/// A notification as the gateway sends it (SPEC section 1). Spelled
/// `HeraldNotification` because Foundation has a `Notification` too.
public typealias HeraldNotification = HeraldCore.Notification
public typealias ReadState = HeraldCore.ReadState
public typealias UserActionState = HeraldCore.UserActionState
public typealias Platform = HeraldCore.Platform
/// Why a notification left this device: `deleted`, `expired`, or `hidden`
/// (retargeted away from it).
public typealias RemovalReason = HeraldCore.DeleteReason

public enum HeraldClientError: Error, Sendable, Equatable {
    /// The gateway refused a request: `code` is its error code
    /// (`not_found`, `precondition_failed`, `forbidden`, ... PROTOCOL.md 11).
    case server(code: String, message: String)
    /// No live connection to send the request on.
    case notConnected
    /// The connection closed before the gateway answered.
    case disconnected
    /// The gateway closed the connection in a way retrying cannot fix
    /// (4003: the token names another device or the device was deleted;
    /// 1008: the hello was refused). The client stops.
    case refused(closeCode: Int, reason: String)
    /// A connection failed or closed (`closeCode` 1006: no close frame, e.g.
    /// refused, dropped, or a certificate that did not verify); the client
    /// retries.
    case connectionLost(closeCode: Int, reason: String)
    /// A frame this client cannot read; it was skipped and changed nothing.
    case badFrame(String)
    /// A frame type this client does not know; skipped (newer gateway).
    case unknownFrame(type: String)
    /// An HTTP request got no answer: refused, dropped, timed out, or a
    /// certificate that did not verify.
    case unreachable(String)
    /// The task waiting for the answer was cancelled.
    case cancelled
    /// The token provider threw; the client retries with backoff.
    case tokenUnavailable(String)
    /// The state file could not be opened, read or written.
    case stateFile(String)
    case badURL(String)
}

public enum ConnectionState: Sendable, Equatable {
    case connecting
    /// Caught up and receiving live changes: `transport` is `websocket`, or
    /// `poll` while WebSocket upgrades are refused (held long-polls).
    case live(transport: String)
    /// Not connected; the next attempt is at `nextRetry` (nil: stopped).
    case offline(nextRetry: ContinuousClock.Instant?)
}

extension HeraldClient {
    public enum Event: Sendable, Equatable {
        /// A notification is new or changed on this device.
        case upserted(HeraldNotification)
        case removed(id: String, reason: RemovalReason)
        /// The whole local set was replaced (newest first): redraw everything.
        case reset([HeraldNotification])
        /// The gateway's unread count for this device.
        case unread(Int)
        case connection(ConnectionState)
        /// Something went wrong that the client handled (skipped a frame,
        /// will retry, stopped): for logs and diagnostics.
        case problem(HeraldClientError)
    }
}

extension HeraldNotification {
    /// Before `other` in the gateway's order: newest `createdAt` first, ties
    /// by higher `id` (byte order).
    func comesBefore(_ other: HeraldNotification) -> Bool {
        createdAt != other.createdAt ? createdAt > other.createdAt : other.id.utf8.lexicographicallyPrecedes(id.utf8)
    }
}

extension Array where Element == HeraldNotification {
    /// The gateway's order (`comesBefore`).
    func newestFirst() -> [HeraldNotification] { sorted { $0.comesBefore($1) } }
}
