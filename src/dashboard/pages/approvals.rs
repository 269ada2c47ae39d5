//! `/approvals`: pending changes with what they would change, approve / deny with a
//! reason (operators), and the history with who decided and the outcome.

use axum::response::Response;

use crate::dashboard::{layout, Viewer};

/// `GET /approvals`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "approvals", "/approvals", "Approvals", |m| {
        m.elem("h2", &[], "Pending");
        m.open("div", &[("id", "approvals-pending"), ("class", "cards")]).close("div");
        m.elem(
            "p",
            &[("id", "approvals-pending-empty"), ("class", "empty"), ("hidden", "")],
            "No approval is waiting for a decision.",
        );
        m.elem("h2", &[], "History");
        m.open("table", &[("class", "rows")]);
        m.open("thead", &[]).open("tr", &[]);
        for col in
            ["Approval", "Kind", "Target", "Requested by", "Outcome", "Decided by", "Reason", "Decided"]
        {
            m.elem("th", &[], col);
        }
        m.close("tr").close("thead");
        m.open("tbody", &[("id", "approvals-history")]).close("tbody");
        m.close("table");
        m.elem(
            "p",
            &[("id", "approvals-history-empty"), ("class", "empty"), ("hidden", "")],
            "No decided approvals yet.",
        );
    })
}
