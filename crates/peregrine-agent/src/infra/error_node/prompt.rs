//! The error node's analysis prompt (upstream's error-analysis prompt builder): a short "why"
//! on top of the structured report, given the capabilities overview and the error context.
//! Error text is cut to a bounded length so a huge traceback cannot overflow the prompt.

use super::{ErrorSummary, truncate};

/// The most characters of error details the analysis prompt carries.
pub const MAX_PROMPT_ERROR_CHARS: usize = 2_000;

/// Builds the error-analysis prompt; override any part.
pub trait ErrorAnalysisPrompts: Send + Sync {
    /// Who the model is.
    fn role(&self) -> String {
        "You are providing error analysis for the assistant system.".into()
    }

    /// What it must write.
    fn instructions(&self) -> String {
        "A structured error report has already been generated with the following information:\n\
         - Error severity and timestamp\n\
         - Task description and failed operation\n\
         - Error message and technical details\n\
         - Execution statistics and summary\n\n\
         Your role is to provide a brief explanation that adds value beyond the structured data:\n\n\
         Requirements:\n\
         - Write 2-3 sentences explaining what likely went wrong\n\
         - Focus on the \"why\" rather than repeating the \"what\"\n\
         - Do NOT repeat the error message or execution details\n\
         - Be specific to system operations when relevant\n\
         - Consider the system capabilities when suggesting alternatives\n\
         - Keep it under 100 words\n\
         - Use a professional, technical tone"
            .into()
    }

    /// The whole prompt: role, instructions, capabilities overview and error context.
    fn analysis_prompt(&self, summary: &ErrorSummary, capabilities_overview: &str) -> String {
        let mut sections = vec![self.role(), self.instructions()];
        if !capabilities_overview.trim().is_empty() {
            sections.push(format!("SYSTEM CAPABILITIES:\n{capabilities_overview}"));
        }
        sections.push(format!(
            "ERROR CONTEXT:\n\
             - Current task: {}\n\
             - Error severity: {}\n\
             - Failed operation: {}\n\
             - Capability: {}\n\n{}",
            truncate(&summary.task, MAX_PROMPT_ERROR_CHARS),
            summary.classification.severity,
            summary.failed_operation,
            summary.capability.as_deref().unwrap_or("Unknown"),
            truncate(&summary.classification.format_for_llm(), MAX_PROMPT_ERROR_CHARS),
        ));
        sections.join("\n\n")
    }
}

/// The framework's default analysis prompt.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultErrorAnalysisPrompts;

impl ErrorAnalysisPrompts for DefaultErrorAnalysisPrompts {}
