// Package converttest holds the namespace tests of conversion under
// "mpdetour run" (docs/convert.md): an unmodified program's connection to a
// server without MPTCP goes direct first, is learned, and later ones go
// through a converter on the program's own socket; converter failures fall
// back direct, destination errors reach the program, learned answers
// expire. A separate package so the run tests do not depend on the
// converter and the router.
package converttest
