// EscapeForLog: a string a client sent (a session id, a peer address, an
// error message that quotes one) made safe for one line of a text log.
// Control characters (C0, DEL) become \n, \r, \t or \xNN, and backslash and
// double quote are escaped, so a value can neither end the line (forging the
// next one) nor break out of the quotes it is logged in. Bytes >= 0x80 pass
// through (UTF-8 text stays readable). O(n); allocates the result.
#pragma once

#include <string>
#include <string_view>

namespace cortiq::util {

std::string EscapeForLog(std::string_view s);

}  // namespace cortiq::util
