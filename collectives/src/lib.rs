//! tessera-collectives: typed collectives over a named device mesh (see the collectives issue).
