// Package detourtest holds the end-to-end test of "mpdetour run" with the
// agent: an unmodified program's connection gets a detour subflow. It is a
// separate package so that the run tests do not depend on the agent
// and lab packages compiling.
package detourtest
