/// A first-in, first-out list whose `removeFirst` costs O(1), amortized:
/// taken elements are skipped, and the storage is compacted only once they
/// are the larger part. The bus holds up to 100,000 records after an
/// outage; an `Array.removeFirst` per confirmed record moved all the rest
/// each time, under the lock the engine publishes through.
struct FIFO<Element> {
    private var items: [Element]
    private var head = 0

    init<S: Sequence<Element>>(_ elements: S) { items = Array(elements) }
    init() { items = [] }

    var count: Int { items.count - head }
    var isEmpty: Bool { head == items.count }
    /// What is in it, oldest first.
    var elements: ArraySlice<Element> { items[head...] }

    mutating func append<S: Sequence<Element>>(contentsOf s: S) { items.append(contentsOf: s) }

    mutating func removeFirst(_ n: Int = 1) {
        precondition(n >= 0 && n <= count, "removing more than a FIFO holds")
        head += n
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 1024 && head > items.count / 2 {
            items.removeFirst(head)
            head = 0
        }
    }

    mutating func removeAll() {
        items.removeAll()
        head = 0
    }
}
