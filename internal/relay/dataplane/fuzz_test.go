package dataplane

import ()
