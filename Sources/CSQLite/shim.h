#include <sqlite3.h>
// SQLITE_TRANSIENT is a cast macro Swift cannot import.
static const sqlite3_destructor_type herald_sqlite_transient = (sqlite3_destructor_type)-1;
