import HeraldCore

/// A WebSocket's queued outgoing frames and their framing (RFC 6455),
/// written by the transport straight to the socket: every queued message of
/// a connection goes out in one `send()` per drain (docs/ARCHITECTURE.md).
public struct WebSocketOutbox {
    private enum Item {
        case frame([UInt8])
        /// A ping or pong, written between messages.
        case control(opcode: UInt8, [UInt8])
        /// A live change, merged with its neighbours into one `changes` frame.
        case change(EncodedChange)

        var size: Int {
            switch self {
            case .frame(let b), .control(_, let b): b.count
            case .change(let c): c.bytes.count
            }
        }
    }

    private var items: [Item] = []
    private var head = 0
    /// Bytes queued and not yet framed for the socket.
    private(set) var bytes = 0

    var isEmpty: Bool { head == items.count }

    mutating func append(_ frame: [UInt8]) { push(.frame(frame)) }

    mutating func append(live c: EncodedChange) { push(.change(c)) }

    mutating func append(control opcode: UInt8, _ payload: [UInt8]) { push(.control(opcode: opcode, payload)) }

    private mutating func push(_ i: Item) {
        items.append(i)
        bytes += i.size
    }

    mutating func removeAll() {
        items.removeAll()
        head = 0
        bytes = 0
    }

    /// Frames queued messages into `out` until nothing is left or `out`
    /// holds `limit` bytes. Adjacent live changes merge into one frame (SPEC
    /// 5 allows it) of at most 500 changes and, past the first, about
    /// `PageBounds.webSocket.bytes`.
    mutating func write(into out: inout [UInt8], limit: Int) {
        while head < items.count, out.count < limit {
            let first = items[head]
            head += 1
            bytes -= first.size
            switch first {
            case .frame(let b):
                Self.header(&out, b.count)
                out.append(contentsOf: b)
            case .control(let opcode, let b):
                Self.header(&out, b.count, opcode: opcode)
                out.append(contentsOf: b)
            case .change(let c):
                var batch = [c.bytes]
                var last = c.seq
                var size = c.bytes.count
                while head < items.count, batch.count < PageBounds.webSocket.items, size < PageBounds.webSocket.bytes,
                      case .change(let next) = items[head] {
                    batch.append(next.bytes)
                    last = next.seq
                    size += next.bytes.count
                    head += 1
                    bytes -= next.bytes.count
                }
                ServerFrame.appendLive(batch[...], cursor: last, to: &out, header: { Self.header(&$0, $1) })
            }
        }
        if head == items.count {
            // Drained: give the buffer back (an idle connection would keep
            // ~150 bytes of it; a live one allocates anew per burst).
            items = []
            head = 0
        } else if head > 1024 {
            items.removeFirst(head)
            head = 0
        }
    }

    static let text: UInt8 = 1, close: UInt8 = 8, ping: UInt8 = 9, pong: UInt8 = 10

    /// A close frame (RFC 6455 5.5.1): the code, then the reason (which
    /// `WebSocketSession.close` keeps within the 123 bytes allowed).
    public static func appendClose(code: UInt16, reason: String, to out: inout [UInt8]) {
        header(&out, 2 + reason.utf8.count, opcode: close)
        out.append(UInt8(code >> 8))
        out.append(UInt8(code & 0xff))
        out.append(contentsOf: reason.utf8)
    }

    /// The header of an unmasked, final frame (RFC 6455 section 5.2).
    static func header(_ out: inout [UInt8], _ length: Int, opcode: UInt8 = text) {
        out.append(0x80 | opcode)
        if length < 126 {
            out.append(UInt8(length))
        } else if length < 65536 {
            out.append(126)
            out.append(UInt8(length >> 8))
            out.append(UInt8(length & 0xff))
        } else {
            out.append(127)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((length >> shift) & 0xff)) }
        }
    }
}
