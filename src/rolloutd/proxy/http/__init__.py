"""The gateway's HTTP side: the server (:mod:`.server`), the app (:mod:`.app`), one router
module per dialect and one for admin; transport only (parsing, auth, rendering)."""
