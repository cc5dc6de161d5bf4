import HeraldCore

/// What a client's frames amount to (RFC 6455 section 5), as
/// `WebSocketFrameReader` reports it.
public enum WebSocketEvent: Equatable, Sendable {
    case text([UInt8])
    /// A binary message began: its bytes are skipped.
    case binary
    /// A message grew past the limit: the rest of it is skipped.
    case tooBig
    case ping([UInt8])
    case pong
    /// The client's close frame, with its body (code and reason, RFC 6455
    /// 5.5.1); nothing after it is read.
    case close([UInt8])
    /// The framing is broken (unmasked, reserved bits, bad opcode or
    /// control frame, continuation out of place): nothing after it is read.
    case protocolError(String)
}

/// Reads a client's frames as their bytes arrive, in any pieces, unmasking
/// payloads straight into the message being joined: a connection holds at
/// most one message (up to `maxMessage` bytes) and a frame header.
public struct WebSocketFrameReader {
    public let maxMessage: Int
    private var header: [UInt8] = []
    /// Payload bytes of the current frame still to come.
    private var remaining = 0
    private var opcode: UInt8 = 0
    private var final = false
    private var mask: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
    private var maskIndex = 0
    private var inFrame = false
    /// The data message being joined (text), or being skipped (binary,
    /// too big) until its final frame.
    private var message: [UInt8] = []
    private var inMessage = false
    private var skipping = false
    private var control: [UInt8] = []
    /// Past a close or a protocol error.
    public private(set) var stopped = false

    public init(maxMessage: Int) { self.maxMessage = maxMessage }

    public mutating func read(_ data: UnsafeRawBufferPointer, _ emit: (WebSocketEvent) -> Void) {
        var i = 0
        while i < data.count, !stopped {
            if !inFrame {
                header.append(data[i])
                i += 1
                guard let started = takeHeader() else { continue }
                if let refused = started {
                    stop(refused, emit)
                    continue
                }
                if opcode < 8 { startData(emit) }
                if remaining == 0 { endFrame(emit) }
                continue
            }
            let n = min(remaining, data.count - i)
            let isControl = opcode >= 8
            if isControl || !skipping {
                let target = data[i..<i + n]
                if isControl {
                    Self.unmask(target, mask, &maskIndex, into: &control)
                } else {
                    Self.unmask(target, mask, &maskIndex, into: &message)
                }
            } else {
                maskIndex = (maskIndex + n) & 3
            }
            remaining -= n
            i += n
            if remaining == 0 { endFrame(emit) }
        }
    }

    /// Parses `header` once it is whole: nil while more bytes are needed,
    /// `.some(nil)` when a frame starts, `.some(event)` when it is refused.
    private mutating func takeHeader() -> WebSocketEvent?? {
        guard header.count >= 2 else { return nil }
        let b0 = header[0], b1 = header[1]
        guard b0 & 0x70 == 0 else { return .some(.protocolError("reserved bits set")) }
        guard b1 & 0x80 != 0 else { return .some(.protocolError("client frames must be masked")) }
        let lengthBytes = switch b1 & 0x7f { case 126: 2; case 127: 8; default: 0 }
        guard header.count >= 2 + lengthBytes + 4 else { return nil }
        defer { header.removeAll(keepingCapacity: true) }
        var length = UInt64(b1 & 0x7f)
        if lengthBytes > 0 {
            length = header[2..<2 + lengthBytes].reduce(0) { $0 << 8 | UInt64($1) }
            guard length >> 63 == 0 else { return .some(.protocolError("frame length out of range")) }
        }
        let op = b0 & 0x0f, fin = b0 & 0x80 != 0
        switch op {
        case 0:
            guard inMessage else { return .some(.protocolError("continuation frame without a message")) }
        case 1, 2:
            guard !inMessage else { return .some(.protocolError("new message inside a fragmented one")) }
        case 8, 9, 10:
            guard fin, length <= 125 else { return .some(.protocolError("control frames must be final and at most 125 bytes")) }
        default:
            return .some(.protocolError("unknown opcode \(op)"))
        }
        let m = 2 + lengthBytes
        mask = (header[m], header[m + 1], header[m + 2], header[m + 3])
        maskIndex = 0
        opcode = op
        final = fin
        inFrame = true
        remaining = Int(clamping: length)
        control.removeAll()
        return .some(nil)
    }

    /// A frame's header is read: data frames check the message limit here,
    /// before any of their payload is kept.
    private mutating func startData(_ emit: (WebSocketEvent) -> Void) {
        if opcode == 2 {
            skipping = true
            emit(.binary)
        } else if !skipping, remaining > maxMessage - message.count {  // a sum could overflow: lengths reach 2^63 - 1
            skipping = true
            message = []
            emit(.tooBig)
        }
        inMessage = true
    }

    private mutating func endFrame(_ emit: (WebSocketEvent) -> Void) {
        inFrame = false
        switch opcode {
        case 8: return stop(.close(control), emit)
        case 9: return emit(.ping(control))
        case 10: return emit(.pong)
        default: break
        }
        guard final else { return }
        let done = message
        let skipped = skipping
        message = []
        inMessage = false
        skipping = false
        if !skipped { emit(.text(done)) }
    }

    private mutating func stop(_ e: WebSocketEvent, _ emit: (WebSocketEvent) -> Void) {
        stopped = true
        message = []
        emit(e)
    }

    private static func unmask(_ bytes: Slice<UnsafeRawBufferPointer>, _ mask: (UInt8, UInt8, UInt8, UInt8),
                               _ maskIndex: inout Int, into out: inout [UInt8]) {
        var k = maskIndex
        out.reserveCapacity(out.count + bytes.count)
        withUnsafeBytes(of: mask) { key in
            for b in bytes {
                out.append(b ^ key[k])
                k = (k + 1) & 3
            }
        }
        maskIndex = k
    }
}
