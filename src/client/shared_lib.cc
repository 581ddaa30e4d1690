// libmemento.so (cmake/package.cmake): the public C++ API in one shared
// library. Its objects come from the static layer archives, linked whole; this
// file only gives the library a translation unit of its own and a way to ask
// a loaded library for its version.
#include "memento/config.h"

extern "C" const char* memento_version() { return MEMENTO_VERSION_STRING; }
